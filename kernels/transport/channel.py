"""TapChannel: target features from pipeline stages to the draft's stage, outside the schedule.

The draft's rank owns one ring of ``ring_depth`` pre-allocated slots per (source stage, tap). A
source calls ``put`` right after its forward of a microbatch: it waits only for the slot's credit
(the consumer released the slot's previous payload), then writes payload and stamp without the
consumer taking part. The draft calls ``get`` just before its own forward of that microbatch and
``release`` when done. Stamps ``seq = step * n_mb + mb`` are derived independently on both sides
and checked: a slot holding any other new stamp raises ``StampMismatchError`` naming source stage,
tap and both stamps. Every wait has a timeout and watches the peer process, so a dead producer, a
stalled consumer or a slow one gives a clear error, never a hang. The channel builds its own process
group; it never touches the pipeline's.

    layout = ChannelLayout(sources={0: [TapSpec("embed", (512, 64))], 1: [TapSpec("L3", (512, 64))]},
                           stage_to_rank={0: 0, 1: 1, 2: 2}, consumer_rank=2, ring_depth=4)
    ch = TapChannel.setup(layout, transport="shm")           # collective over the default group
    ch.put(stage=1, name="L3", seq=s, tensor=h)               # on rank 1
    feats = ch.get_stage(1, s); ...; ch.release(1, s)         # on rank 2
    ch.close()                                                # collective, before PG teardown

Transports: ``shm`` and ``host_staging`` (CPU/colocated), ``gloo`` (CPU, remote stand-in),
``cuda_ipc`` (colocated GPUs); see ``kernels.transport.transports``.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from kernels.transport.control import EMPTY, pid_alive
from kernels.transport.spec import (
    ChannelLayout,
    PeerDiedError,
    StampMismatchError,
    TapChannelError,
    TapTimeoutError,
)
from kernels.transport.transports import make_transport
from kernels.transport.transports.base import Transport


@dataclass
class ChannelStats:
    """Per-operation records: puts on sources, gets on the draft's rank."""

    puts: list[dict] = field(default_factory=list)
    gets: list[dict] = field(default_factory=list)


class TapChannel:
    """A mailbox of rings on the consumer's rank; see the module docstring."""

    def __init__(self, layout: ChannelLayout, transport: str | Transport = "shm", *, rank: int = 0,
                 group=None, device: torch.device | str = "cpu", get_timeout_s: float = 60.0,
                 put_timeout_s: float = 60.0, liveness_interval_s: float = 0.05):
        if get_timeout_s <= 0 or put_timeout_s <= 0:
            raise ValueError(f"timeouts must be positive, got get={get_timeout_s}, put={put_timeout_s}")
        if group is None and rank in layout.ranks and layout.ranks != {rank}:
            raise ValueError(f"layout spans ranks {sorted(layout.ranks)}; a channel without a process "
                             f"group can only serve rank {rank} alone (use TapChannel.setup)")
        self.layout, self.rank, self.group = layout, rank, group
        self.device = torch.device(device)
        self.get_timeout_s, self.put_timeout_s = get_timeout_s, put_timeout_s
        self.liveness_interval_s = liveness_interval_s
        self.transport = make_transport(transport) if isinstance(transport, str) else transport
        self.stats = ChannelStats()
        self.member = rank in layout.ranks
        d, n = layout.ring_depth, len(layout.rings)
        self._last_written = [[EMPTY] * d for _ in range(n)]   # producer side
        self._last_released = [[EMPTY] * d for _ in range(n)]  # consumer side
        self._held: list[list[int | None]] = [[None] * d for _ in range(n)]
        self._held_view: dict[tuple[int, int], torch.Tensor] = {}
        self._closed = False
        self._peers: dict[int, tuple[str, int]] = {rank: (socket.gethostname(), os.getpid())}
        if self.member:
            if group is not None:
                box: list = [None] * dist.get_world_size(group)
                dist.all_gather_object(box, (rank, socket.gethostname(), os.getpid()), group=group)
                self._peers = {r: (h, p) for r, h, p in box}
            self.transport.open(layout, rank, group, self.device)

    @classmethod
    def setup(cls, layout: ChannelLayout, transport: str | Transport = "shm", *, world_group=None,
              backend: str = "gloo", **kwargs) -> TapChannel:
        """Collective over ``world_group`` (default: the whole world): builds the channel's own group
        of the layout's ranks and opens the rings. Every rank of the world must call it."""
        world = dist.get_world_size(world_group)
        rank = dist.get_rank()
        bad = [r for r in layout.ranks if not 0 <= r < world]
        if bad:
            raise ValueError(f"layout names ranks {bad} outside the world of {world} ranks")
        group = dist.new_group(ranks=sorted(layout.ranks), backend=backend)
        return cls(layout, transport, rank=rank, group=group if rank in layout.ranks else None, **kwargs)

    # -- helpers ---------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise TapChannelError(f"rank {self.rank}: TapChannel used after close()")

    def _peer_dead(self, rank: int) -> str | None:
        host, pid = self._peers.get(rank, (None, None))
        if pid is None or host != socket.gethostname():
            return None  # remote peers are only caught by the timeout
        return None if pid_alive(pid) else f"rank {rank} (pid {pid}) has exited"

    def _wait(self, ready, describe, peer_rank: int, timeout_s: float, what: str):
        """Spin, then sleep with backoff, until ``ready()`` returns non-None; watch the peer."""
        t0 = time.monotonic()
        next_live = t0 + self.liveness_interval_s
        while True:
            out = ready()
            if out is not None:
                return out
            now = time.monotonic()
            if now >= next_live:
                died = self._peer_dead(peer_rank)
                if died is not None:
                    raise PeerDiedError(f"{what}: {died}; {describe()}")
                next_live = now + self.liveness_interval_s
            if now - t0 > timeout_s:
                raise TapTimeoutError(f"{what}: no progress within {timeout_s:g} s; {describe()}")
            # Yield for the first 0.2 ms, then nap briefly (fine latency for ms transfers), then back
            # off to 1 ms so a long wait (a slow peer) does not burn a shared core.
            waited = now - t0
            time.sleep(0 if waited < 2e-4 else 2e-5 if waited < 5e-3 else min(1e-3, waited / 20))

    # -- producer --------------------------------------------------------------------------------
    def put(self, stage: int, name: str, seq: int, tensor: torch.Tensor) -> None:
        """Write ``tensor`` (detached; dim 0 <= max) as tap ``name`` of ``stage`` for ``seq``.

        Returns once the write is issued; waits only for the slot's credit (back-pressure)."""
        self._check_open()
        ring = self.layout.ring(stage, name)
        if ring.source_rank != self.rank:
            raise ValueError(f"put of stage {stage} tap {name!r} on rank {self.rank}; that stage runs on "
                             f"rank {ring.source_rank}")
        put_ns = time.monotonic_ns()
        length = ring.tap.check(tensor, f"put(stage={stage}, seq={seq})")
        d = self.layout.ring_depth
        slot = seq % d
        last = self._last_written[ring.index][slot]
        if seq < 0:
            raise ValueError(f"put(stage={stage}, tap={name!r}): seq {seq} must be >= 0")
        if last != EMPTY and seq <= last:
            raise StampMismatchError(
                f"source stage {stage}, tap {name!r}: put of seq {seq} into slot {slot} after seq {last} was "
                f"already written there; stamps must increase (step/microbatch derivation out of sync?)")
        if last != EMPTY:
            def credited():
                c = self.transport.credit(ring, slot)
                if c > last:
                    raise StampMismatchError(
                        f"source stage {stage}, tap {name!r}: slot {slot} credit says seq {c} was released, "
                        f"but the last seq written there is {last}")
                return True if c == last else None

            self._wait(credited, lambda: (
                f"back-pressure: draft rank {self.layout.consumer_rank} has not released seq {last} of "
                f"source stage {stage} tap {name!r} (slot {slot}, ring depth {d}), so seq {seq} cannot be "
                f"written; the consumer is slow/stalled or ring_depth is too small"),
                self.layout.consumer_rank, self.put_timeout_s, f"put(stage={stage}, seq={seq})")
        waited = time.monotonic_ns() - put_ns
        self.transport.publish(ring, slot, tensor.detach(), seq, put_ns)
        self._last_written[ring.index][slot] = seq
        self.stats.puts.append({"stage": stage, "tap": name, "seq": seq, "bytes": length * ring.tap.row_numel
                                * ring.tap.itemsize, "credit_wait_s": waited / 1e9,
                                "issue_s": (time.monotonic_ns() - put_ns - waited) / 1e9, "t_ns": put_ns})

    # -- consumer --------------------------------------------------------------------------------
    def get(self, stage: int, name: str, seq: int, timeout_s: float | None = None) -> torch.Tensor:
        """The payload of tap ``name`` from ``stage`` for ``seq``; waits for its stamp. Read-only view,
        valid until ``release(stage, seq)``."""
        self._check_open()
        ring = self.layout.ring(stage, name)
        if self.rank != self.layout.consumer_rank:
            raise ValueError(f"get on rank {self.rank}; the rings live on rank {self.layout.consumer_rank}")
        if seq < 0:
            raise ValueError(f"get(stage={stage}, tap={name!r}): seq {seq} must be >= 0")
        d = self.layout.ring_depth
        slot = seq % d
        held = self._held[ring.index][slot]
        if held == seq:
            return self._held_view[(ring.index, slot)]
        if held is not None:
            raise TapChannelError(
                f"get(source stage {stage}, tap {name!r}, seq {seq}) needs slot {slot}, which still holds "
                f"seq {held} that was never released; release it first or raise ring_depth (now {d})")
        prev = self._last_released[ring.index][slot]
        if prev != EMPTY and seq <= prev:
            raise StampMismatchError(f"source stage {stage}, tap {name!r}: get of seq {seq} but seq {prev} "
                                     f"was already consumed from slot {slot}")
        t_call = time.monotonic_ns()

        def arrived():
            stamp, length, put_ns, pub_ns = self.transport.poll(ring, slot)
            if stamp == seq:
                return length, put_ns, pub_ns
            if stamp != prev:
                hint = (f"; seq {stamp} was never consumed, so seq {seq} is more than ring depth {d} ahead"
                        if stamp < seq else "")
                raise StampMismatchError(f"source stage {stage}, tap {name!r}: slot {slot} holds seq "
                                         f"{stamp}, expected seq {seq}{hint}")
            return None

        length, put_ns, pub_ns = self._wait(arrived, lambda: (
            f"draft rank {self.rank} still waits for source stage {stage} (rank {ring.source_rank}) tap "
            f"{name!r} seq {seq} (slot {slot} still holds seq {prev if prev != EMPTY else 'none'})"),
            ring.source_rank, self.get_timeout_s if timeout_s is None else timeout_s,
            f"get(stage={stage}, tap={name!r}, seq={seq})")
        t_got = time.monotonic_ns()
        view = self.transport.view(ring, slot, length)
        self._held[ring.index][slot] = seq
        self._held_view[(ring.index, slot)] = view
        self.stats.gets.append({
            "stage": stage, "tap": name, "seq": seq, "bytes": length * ring.tap.row_numel * ring.tap.itemsize,
            "wait_s": (t_got - t_call) / 1e9, "transfer_s": (pub_ns - put_ns) / 1e9,
            "slack_s": (t_call - pub_ns) / 1e9, "view_s": (time.monotonic_ns() - t_got) / 1e9})
        return view

    def get_stage(self, stage: int, seq: int, timeout_s: float | None = None) -> dict[str, torch.Tensor]:
        """Every tap of ``stage`` for ``seq``, by tap name."""
        return {r.tap.name: self.get(stage, r.tap.name, seq, timeout_s)
                for r in self.layout.rings_of_stage(stage)}

    def release(self, stage: int, seq: int) -> None:
        """Return the slots of every tap of ``stage`` holding ``seq`` to their producers."""
        self._check_open()
        for ring in self.layout.rings_of_stage(stage):
            slot = seq % self.layout.ring_depth
            if self._held[ring.index][slot] != seq:
                raise TapChannelError(f"release(stage={stage}, seq={seq}): tap {ring.tap.name!r} slot {slot} "
                                      f"holds {self._held[ring.index][slot]}, not seq {seq} (get it first)")
            self._held[ring.index][slot] = None
            self._held_view.pop((ring.index, slot), None)
            self._last_released[ring.index][slot] = seq
            self.transport.release(ring, slot, seq)

    # -- lifecycle -------------------------------------------------------------------------------
    def flush(self) -> None:
        """Wait until this rank's puts and releases are visible on the other side."""
        if self.member:
            self.transport.flush()

    def close(self, timeout_s: float = 60.0) -> None:
        """Collective over the channel's ranks; call before destroying the process groups."""
        if self._closed:
            return
        self._closed = True
        if not self.member:
            return
        self.transport.flush()
        self._held_view.clear()
        self.transport.shutdown()
        if self.group is not None:
            self._barrier(timeout_s)  # every rank flushed: no write is still in flight
        if self.rank != self.layout.consumer_rank:
            self.transport.close()  # sources detach before the consumer frees the rings
        if self.group is not None:
            self._barrier(timeout_s)
        if self.rank == self.layout.consumer_rank:
            self.transport.close()
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None

    def _barrier(self, timeout_s: float) -> None:
        import datetime
        try:
            dist.monitored_barrier(self.group, timeout=datetime.timedelta(seconds=timeout_s))
        except RuntimeError as exc:
            raise TapChannelError(f"rank {self.rank}: TapChannel.close() barrier failed: {exc}") from exc

    def report(self) -> dict:
        """Aggregate of the per-operation stats (bytes, waits, transfer times, slack)."""
        def agg(rows, key):
            vals = [r[key] for r in rows]
            return {"sum": sum(vals), "max": max(vals) if vals else 0.0, "n": len(vals)}
        out = {"transport": self.transport.name, "rank": self.rank}
        if self.stats.puts:
            out["put"] = {k: agg(self.stats.puts, k) for k in ("bytes", "credit_wait_s", "issue_s")}
        if self.stats.gets:
            out["get"] = {k: agg(self.stats.gets, k) for k in ("bytes", "wait_s", "transfer_s", "slack_s")}
        return out
