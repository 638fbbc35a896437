"""Point-to-point transport over torch.distributed, one code path for gloo (CPU) and NCCL (GPU).

The remote-source path: a source on another rank (another node) sends each tap to the draft's rank on
the channel's own process group. Every (source rank, draft rank) pair carries one FIFO of messages in a
canonical order both sides derive from the stamps alone: seq by seq from ``first_seq``, the pair's rings
in layout order within a seq. A message is a whole slot, ``[header | payload area]`` (static shapes, as
NCCL needs equal counts on both sides; the header's length field says how many rows are valid).

  draft's rank   receives are pre-posted straight into the slots, ``ring_depth`` seqs ahead; item
                 (ring, seq) = send the credit of (ring, seq - depth) once released, then post the
                 receive of (ring, seq) into the freed slot. A ``get`` asks the driver to complete the
                 slot's receive (and every earlier one of that ring) and publish its stamp.
  source rank    item (ring, seq) = receive the credit of (ring, seq - depth), then send the slot
                 copied (on the channel's stream) from the tensor ``put`` gave.

One driver thread per rank issues every operation on the channel's communicator, in that one order
(NCCL's rule; gloo's ``Work.is_completed`` cannot be polled for receives, so the driver waits in the
same order instead of polling). Device tensors go through the channel's own CUDA stream. Every stamp
must be put, in order, for every tap of a source (what a pipeline schedule does); a skipped or
reordered stamp raises. Sources on the draft's own rank write their slots directly.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import deque

import torch
import torch.distributed as dist

from kernels.transport.control import CREDIT, LENGTH, PUBLISH_NS, PUT_NS, STAMP, ControlBlock
from kernels.transport.spec import ChannelLayout, RingId, StampMismatchError
from kernels.transport.transports.base import Transport

HEADER = 4            # int64 words before the payload: seq, length, put_ns, ring index
_STOP = -2            # a header seq (or credit seq) that ends the pair's traffic at shutdown


def _backend(group) -> str:
    return str(dist.get_backend(group)).lower() if group is not None else "none"


class P2PTransport(Transport):
    name = "p2p"

    def __init__(self, first_seq: int = 0):
        super().__init__()
        if first_seq < 0:
            raise ValueError(f"first_seq {first_seq} must be >= 0")
        self.first_seq = first_seq

    # -- setup -----------------------------------------------------------------------------------
    def open(self, layout: ChannelLayout, rank: int, group, device: torch.device) -> None:
        device = torch.device(device)
        backend = _backend(group)
        remote = [r for r in layout.rings if r.source_rank != layout.consumer_rank]
        if remote and group is None:
            raise ValueError("transport 'p2p' needs the channel's process group for remote sources")
        if remote and backend == "nccl" and device.type != "cuda":
            raise ValueError(f"transport 'p2p' over NCCL carries CUDA tensors; the channel's device "
                             f"is {device}")
        if remote and backend == "gloo" and device.type != "cpu":
            raise ValueError("transport 'p2p' over gloo carries CPU tensors; the channel's device is "
                             f"{device} (build the channel with backend='nccl' for CUDA tensors)")
        self.layout, self.rank, self.group, self.device = layout, rank, group, device
        self._consumer = rank == layout.consumer_rank
        self._depth = layout.ring_depth
        self.ctrl = ControlBlock.private(len(layout.rings), layout.ring_depth)
        self._stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
        def words(r: RingId) -> int:     # header + the payload in int64 words
            return HEADER + -(-r.tap.max_nbytes // 8)

        self._slots: dict[tuple[int, int], torch.Tensor] = {}
        if self._consumer:
            mine = layout.rings
            self._pairs = {src: [r for r in remote if r.source_rank == src]
                           for src in sorted({r.source_rank for r in remote})}
        else:
            mine = [r for r in layout.rings if r.source_rank == rank]
            self._pairs = {layout.consumer_rank: mine} if mine else {}
        for r in mine:
            for s in range(self._depth):
                self._slots[(r.index, s)] = torch.zeros(words(r), dtype=torch.int64, device=device)
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._stop = False
        self._released: dict[tuple[int, int], int] = {}      # consumer: (ring, seq) -> ready event or 0
        self._demand: set[tuple[int, int]] = set()           # consumer: (ring, seq) receives wanted
        self._pending: dict[tuple[int, int], int] = {}       # consumer: (ring, slot) -> seq posted, not done
        self._posted: dict[int, deque] = {r.index: deque() for r in remote}   # ring -> (seq, slot, work)
        self._published: dict[tuple[int, int], object] = {}  # source: (ring, seq) -> copy-done marker
        self._next_put = {r.index: self.first_seq for r in mine if r.source_rank == rank}
        self._credit_need: set[int] = set()                 # source: rings waiting for a credit
        self._sends: deque = deque()                         # consumer: credit sends (work, tensor)
        self._slot_sends: dict[tuple[int, int], object] = {}  # source: the send in flight per slot
        self._thread = None
        if self._pairs:
            self._thread = threading.Thread(target=self._drive, daemon=True,
                                            name=f"tapchannel-p2p-rank{rank}")
            self._thread.start()

    # -- the driver: every communicator operation of this rank, in canonical order -----------------
    def _canonical(self, rings: list[RingId]):
        seq = self.first_seq
        while True:
            for r in rings:
                yield r, seq
            seq += 1

    @contextlib.contextmanager
    def _on_stream(self):
        if self._stream is None:
            yield
        else:
            with torch.cuda.stream(self._stream):
                yield

    def _done(self, work) -> None:
        """Block until ``work`` finished (on the device too: NCCL's wait only orders the stream)."""
        work.wait()
        if self._stream is not None:
            self._stream.synchronize()

    def _drive(self) -> None:
        try:
            with self._on_stream():
                if self._consumer:
                    self._drive_consumer()
                else:
                    self._drive_source()
        except BaseException as exc:  # noqa: BLE001 - surfaced on the next call from the main thread
            self._error = exc
            with self._cond:
                self._cond.notify_all()

    def _drive_consumer(self) -> None:
        plans = {src: self._canonical(rings) for src, rings in self._pairs.items()}
        nxt = {src: next(plan) for src, plan in plans.items()}
        while True:
            with self._cond:
                while True:
                    ready = [src for src, (r, s) in nxt.items() if s < self.first_seq + self._depth
                             or (r.index, s - self._depth) in self._released]
                    if ready or self._demand or self._stop:
                        break
                    self._cond.wait()
                releases = {src: self._released.pop((nxt[src][0].index, nxt[src][1] - self._depth), 0)
                            for src in ready}
                demand, self._demand = self._demand, set()
                stop = self._stop and not ready and not demand
            for src in ready:           # credit of (ring, seq - depth), then the receive of (ring, seq)
                r, s = nxt[src]
                slot = s % self._depth
                if s >= self.first_seq + self._depth:
                    event = releases[src]
                    if event:
                        self._stream.wait_event(event)   # the draft's reads of the slot come first
                    credit = torch.tensor([r.index, slot, s - self._depth], dtype=torch.int64,
                                          device=self.device)
                    self._sends.append((dist.isend(credit, dst=src, group=self.group), credit))
                self._posted[r.index].append((s, slot, dist.irecv(self._slots[(r.index, slot)], src=src,
                                                                  group=self.group)))
                with self._cond:
                    self._pending[(r.index, slot)] = s
                nxt[src] = next(plans[src])
            while self._sends and self._sends[0][0].is_completed():
                self._sends.popleft()
            for ring_i, seq in sorted(demand):
                self._complete(ring_i, seq)
            if stop:
                return self._finish_consumer(nxt)

    def _complete(self, ring_i: int, want_seq: int) -> None:
        """Finish a ring's posted receives, oldest first, up to the one of ``want_seq`` (none if it is done
        already), and publish each stamp (the header's seq: a wrong one is the channel's
        StampMismatchError)."""
        while self._posted[ring_i] and self._posted[ring_i][0][0] <= want_seq:
            _seq, slot, work = self._posted[ring_i].popleft()
            self._done(work)
            head = self._slots[(ring_i, slot)][:HEADER].tolist()
            with self._cond:
                w = self.ctrl.words[ring_i, slot]
                w[LENGTH], w[PUT_NS], w[PUBLISH_NS] = head[1], head[2], time.monotonic_ns()
                w[STAMP] = head[0]
                self._pending.pop((ring_i, slot), None)

    def _finish_consumer(self, nxt) -> None:
        """Shutdown: tell each source the last credit sent per ring, then complete every posted receive
        (data nobody asked for, or the source's stop fillers) and every credit send."""
        for src, rings in self._pairs.items():
            r_next, s_next = nxt[src]
            for r in rings:
                # the last credited seq of r: items before nxt were posted, so their credits were sent
                first_unposted = s_next if r.index >= r_next.index else s_next + 1
                last_credit = first_unposted - 1 - self._depth
                msg = torch.tensor([_STOP, r.index, last_credit], dtype=torch.int64, device=self.device)
                self._sends.append((dist.isend(msg, dst=src, group=self.group), msg))
        for posted in self._posted.values():
            while posted:
                self._done(posted.popleft()[2])
        while self._sends:
            self._done(self._sends.popleft()[0])

    def _drive_source(self) -> None:
        dst = self.layout.consumer_rank
        rings = self._pairs[dst]
        plan = self._canonical(rings)
        credit = torch.empty(3, dtype=torch.int64, device=self.device)
        r, s = next(plan)
        while True:
            if s >= self.first_seq + self._depth:                 # the credit of (r, s - depth) first
                with self._cond:
                    while r.index not in self._credit_need and (r.index, s) not in self._published \
                            and not self._stop:
                        self._cond.wait()
                    if self._stop and (r.index, s) not in self._published:
                        return self._finish_source(r, s)
                self._done(dist.irecv(credit, src=dst, group=self.group))
                ring_i, slot, seq = credit.tolist()
                if ring_i == _STOP:
                    raise StampMismatchError(f"p2p rank {self.rank}: the draft's rank shut down while ring "
                                             f"{r.index} waited for the credit of seq {s - self._depth}")
                if (ring_i, seq) != (r.index, s - self._depth):
                    raise StampMismatchError(f"p2p rank {self.rank}: credit for ring {ring_i} seq {seq} "
                                             f"arrived, expected ring {r.index} seq {s - self._depth}")
                before = self._slot_sends.pop((ring_i, slot), None)
                if before is not None:
                    before.wait()      # the slot's next copy (channel stream) waits for its last send
                with self._cond:
                    self.ctrl.words[ring_i, slot, CREDIT] = seq
                    self._credit_need.discard(ring_i)
            with self._cond:                                      # then the slot itself
                while (r.index, s) not in self._published and not self._stop:
                    self._cond.wait()
                if (r.index, s) not in self._published:
                    return self._finish_source(r, s)
                marker = self._published.pop((r.index, s))
            if marker is not None:
                self._stream.wait_event(marker)
            slot = s % self._depth
            self._slot_sends[(r.index, slot)] = dist.isend(self._slots[(r.index, slot)], dst=dst,
                                                           group=self.group)
            with self._cond:
                self._cond.notify_all()
            r, s = next(plan)

    def _finish_source(self, r_next: RingId, s_next: int) -> None:
        """Shutdown: read the remaining credits up to each ring's stop message, then fill every receive
        the draft's rank still has posted with a stop header."""
        dst = self.layout.consumer_rank
        rings = self._pairs[dst]
        # credits of items before (r_next, s_next) were already received; the rest come in canonical order
        msg = torch.empty(3, dtype=torch.int64, device=self.device)
        last_credit: dict[int, int] = {}
        while len(last_credit) < len(rings):
            self._done(dist.irecv(msg, src=dst, group=self.group))
            a, b, c = msg.tolist()
            if a == _STOP:
                last_credit[b] = c
        for r in rings:
            sent_upto = s_next - 1 if r.index >= r_next.index else s_next
            for seq in range(sent_upto + 1, last_credit[r.index] + self._depth + 1):
                buf = torch.zeros_like(self._slots[(r.index, 0)])
                buf[0] = _STOP
                self._sends.append((dist.isend(buf, dst=dst, group=self.group), buf))
        for work in self._slot_sends.values():
            self._done(work)
        self._slot_sends = {}
        while self._sends:
            self._done(self._sends.popleft()[0])

    def _check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"p2p transport driver on rank {self.rank} failed: "
                               f"{self._error!r}") from self._error

    # -- producer --------------------------------------------------------------------------------
    def publish(self, ring: RingId, slot: int, tensor: torch.Tensor, seq: int, put_ns: int) -> None:
        self._check()
        if tensor.device.type != self.device.type:
            raise ValueError(f"transport 'p2p' on {self.device} got tap {ring.tap.name!r} of stage "
                             f"{ring.stage} on {tensor.device}")
        n = tensor.shape[0]
        buf = self._slots[(ring.index, slot)]
        payload = self.view(ring, slot, ring.tap.max_shape[0])
        if self._consumer:  # a source on the draft's own rank writes its slot directly
            payload[:n].copy_(tensor)
            w = self.ctrl.words[ring.index, slot]
            w[LENGTH], w[PUT_NS], w[PUBLISH_NS] = n, put_ns, time.monotonic_ns()
            w[STAMP] = seq
            return
        if seq != self._next_put[ring.index]:
            raise StampMismatchError(f"transport 'p2p': stage {ring.stage} tap {ring.tap.name!r} put seq "
                                     f"{seq}, expected seq {self._next_put[ring.index]} (p2p carries every "
                                     "stamp of every tap, in order)")
        self._next_put[ring.index] = seq + 1
        header = torch.tensor([seq, n, put_ns, ring.index], dtype=torch.int64)
        marker = None
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream(tensor.device))
            with torch.cuda.stream(self._stream):
                payload[:n].copy_(tensor, non_blocking=True)
                buf[:HEADER].copy_(header, non_blocking=False)
                marker = torch.cuda.Event()
                marker.record(self._stream)
            tensor.record_stream(self._stream)
        else:
            payload[:n].copy_(tensor)
            buf[:HEADER].copy_(header)
        with self._cond:
            self._published[(ring.index, seq)] = marker
            self._cond.notify_all()

    def credit(self, ring: RingId, slot: int) -> int:
        self._check()
        with self._cond:
            if ring.source_rank != self.rank or self._consumer:
                return int(self.ctrl.words[ring.index, slot, CREDIT])
            self._credit_need.add(ring.index)
            self._cond.notify_all()
            return int(self.ctrl.words[ring.index, slot, CREDIT])

    def flush(self) -> None:
        """Sources: wait until every published slot was handed to the communicator."""
        while True:
            self._check()
            with self._cond:
                if not self._published or self._consumer:
                    return
                self._cond.wait(timeout=0.05)

    # -- consumer --------------------------------------------------------------------------------
    def poll(self, ring: RingId, slot: int) -> tuple[int, int, int, int]:
        self._check()
        w = self.ctrl.words[ring.index, slot]
        stamp = int(w[STAMP])
        if ring.source_rank != self.rank:
            with self._cond:
                if (ring.index, slot) in self._pending:
                    self._demand.add((ring.index, self._pending[(ring.index, slot)]))
                    self._cond.notify_all()
                w = self.ctrl.words[ring.index, slot]
                stamp = int(w[STAMP])
        return stamp, int(w[LENGTH]), int(w[PUT_NS]), int(w[PUBLISH_NS])

    def view(self, ring: RingId, slot: int, length: int) -> torch.Tensor:
        buf = self._slots[(ring.index, slot)]
        return buf[HEADER:].view(torch.uint8)[:ring.tap.max_nbytes].view(ring.tap.dtype).view(
            ring.tap.max_shape)[:length]

    def release(self, ring: RingId, slot: int, seq: int) -> None:
        self._check()
        self.ctrl.words[ring.index, slot, CREDIT] = seq
        if ring.source_rank == self.rank:
            return
        event = 0
        if self._stream is not None:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
        with self._cond:
            self._released[(ring.index, seq)] = event
            self._cond.notify_all()

    # -- lifecycle -------------------------------------------------------------------------------
    def shutdown(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)
            if self._thread.is_alive():
                raise RuntimeError(f"p2p transport on rank {self.rank}: driver did not stop within 60 s")
            self._thread = None
        self._check()

    def close(self) -> None:
        self._slots = {}


