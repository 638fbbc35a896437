"""Gloo point-to-point transport: the CPU stand-in for a remote (cross-node) source.

Runs on the channel's own gloo process group, never the pipeline's. Each (source rank, draft rank)
pair is one FIFO, as in vLLM's PP aux-state path: the source's sender thread sends a fixed-size
header ``[ring, slot, seq, length, put_ns]`` and then the payload; the draft's receiver thread for
that source reads the header and receives the payload straight into the named slot, and only then
stores the stamp in its private mirror of the control words. Credits travel back the same way
(``[ring, slot, seq]``). ``put`` and ``release`` only enqueue, so they never block on the network.
Sources on the draft's own rank write their slots directly. (Gloo's ``Work.is_completed`` does not
report receive completion before ``wait()``, so each direction gets a blocking thread instead of
polled pre-posted receives.)
"""
from __future__ import annotations

import queue
import threading
import time

import torch
import torch.distributed as dist

from kernels.transport.control import CREDIT, LENGTH, PUBLISH_NS, PUT_NS, STAMP, ControlBlock
from kernels.transport.spec import ChannelLayout, RingId
from kernels.transport.transports.base import Transport

_TAG_HEADER, _TAG_PAYLOAD, _TAG_CREDIT = 11, 12, 13
_STOP = -1


class GlooTransport(Transport):
    name = "gloo"

    def open(self, layout: ChannelLayout, rank: int, group, device: torch.device) -> None:
        remote = sorted({r.source_rank for r in layout.rings if r.source_rank != layout.consumer_rank})
        if group is None and remote:
            raise ValueError("transport 'gloo' needs the channel's process group for remote sources")
        self.layout, self.rank, self.group = layout, rank, group
        self._consumer = rank == layout.consumer_rank
        self._rings = {r.index: r for r in layout.rings}
        self.ctrl = ControlBlock.private(len(layout.rings), layout.ring_depth)
        self._slots: dict[tuple[int, int], torch.Tensor] = {}
        if self._consumer:
            for r in layout.rings:
                for s in range(layout.ring_depth):
                    self._slots[(r.index, s)] = torch.empty(r.tap.max_shape, dtype=r.tap.dtype)
        self._error: BaseException | None = None
        self._outbox: queue.Queue = queue.Queue()
        self._threads = [threading.Thread(target=self._guard, args=(self._send_loop,), daemon=True,
                                          name=f"tapchannel-gloo-send-rank{rank}")]
        if self._consumer:
            self._peers = remote
            for src in remote:
                name = f"tapchannel-gloo-recv{src}-rank{rank}"
                self._threads.append(threading.Thread(target=self._guard, args=(self._recv_loop, src),
                                                      daemon=True, name=name))
        elif any(r.source_rank == rank for r in layout.rings):
            self._peers = [layout.consumer_rank]
            self._threads.append(threading.Thread(target=self._guard, args=(self._credit_loop,), daemon=True,
                                                  name=f"tapchannel-gloo-credit-rank{rank}"))
        else:
            self._peers = []
        for t in self._threads:
            t.start()

    # -- threads ---------------------------------------------------------------------------------
    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - surfaced on the next call from the main thread
            self._error = exc

    def _send_loop(self) -> None:
        while True:
            item = self._outbox.get()
            try:
                if item is None:
                    return
                dst, parts = item
                for tensor, tag in parts:
                    dist.send(tensor, dst=dst, group=self.group, tag=tag)
            finally:
                self._outbox.task_done()

    def _recv_loop(self, src: int) -> None:
        header = torch.empty(5, dtype=torch.int64)
        while True:
            dist.recv(header, src=src, group=self.group, tag=_TAG_HEADER)
            ring_i, slot, seq, length, put_ns = (int(x) for x in header)
            if ring_i == _STOP:
                return
            ring = self._rings[ring_i]
            dist.recv(self._slots[(ring_i, slot)][:length], src=src, group=self.group, tag=_TAG_PAYLOAD)
            w = self.ctrl.words[ring.index, slot]
            w[LENGTH], w[PUT_NS], w[PUBLISH_NS] = length, put_ns, time.monotonic_ns()
            w[STAMP] = seq

    def _credit_loop(self) -> None:
        msg = torch.empty(3, dtype=torch.int64)
        while True:
            dist.recv(msg, src=self.layout.consumer_rank, group=self.group, tag=_TAG_CREDIT)
            ring_i, slot, seq = (int(x) for x in msg)
            if ring_i == _STOP:
                return
            self.ctrl.words[ring_i, slot, CREDIT] = seq

    def _check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"gloo transport thread on rank {self.rank} failed: {self._error!r}")

    # -- producer --------------------------------------------------------------------------------
    def publish(self, ring: RingId, slot: int, tensor: torch.Tensor, seq: int, put_ns: int) -> None:
        self._check()
        if tensor.device.type != "cpu":
            raise ValueError(f"transport 'gloo' carries CPU tensors; tap {ring.tap.name!r} is on "
                             f"{tensor.device}")
        n = tensor.shape[0]
        if self._consumer:  # a source on the draft's own rank writes its slot directly
            self._slots[(ring.index, slot)][:n].copy_(tensor)
            w = self.ctrl.words[ring.index, slot]
            w[LENGTH], w[PUT_NS], w[PUBLISH_NS] = n, put_ns, time.monotonic_ns()
            w[STAMP] = seq
            return
        header = torch.tensor([ring.index, slot, seq, n, put_ns], dtype=torch.int64)
        messages = [(header, _TAG_HEADER), (tensor.contiguous(), _TAG_PAYLOAD)]
        self._outbox.put((self.layout.consumer_rank, messages))

    def credit(self, ring: RingId, slot: int) -> int:
        self._check()
        return int(self.ctrl.words[ring.index, slot, CREDIT])

    def flush(self) -> None:
        self._outbox.join()
        self._check()

    # -- consumer --------------------------------------------------------------------------------
    def poll(self, ring: RingId, slot: int) -> tuple[int, int, int, int]:
        self._check()
        w = self.ctrl.words[ring.index, slot]
        stamp = int(w[STAMP])
        return stamp, int(w[LENGTH]), int(w[PUT_NS]), int(w[PUBLISH_NS])

    def view(self, ring: RingId, slot: int, length: int) -> torch.Tensor:
        return self._slots[(ring.index, slot)][:length]

    def release(self, ring: RingId, slot: int, seq: int) -> None:
        self.ctrl.words[ring.index, slot, CREDIT] = seq
        if ring.source_rank != self.rank:
            self._outbox.put((ring.source_rank, [(torch.tensor([ring.index, slot, seq], dtype=torch.int64),
                                                  _TAG_CREDIT)]))

    # -- lifecycle -------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the peer's receiver threads (one sentinel per pair and direction), then ours."""
        stop = torch.tensor([_STOP, 0, 0, 0, 0], dtype=torch.int64)
        for peer in self._peers:
            if self._consumer:
                self._outbox.put((peer, [(stop[:3].clone(), _TAG_CREDIT)]))
            else:
                self._outbox.put((peer, [(stop, _TAG_HEADER)]))
        self._outbox.put(None)
        for t in self._threads:
            t.join(timeout=30)
        alive = [t.name for t in self._threads if t.is_alive()]
        self._threads = []
        if alive:
            raise RuntimeError(f"gloo transport on rank {self.rank}: threads {alive} did not stop "
                               "within 30 s")
        self._check()

    def close(self) -> None:
        self._slots = {}
