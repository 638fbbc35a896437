"""Gloo point-to-point transport: the CPU stand-in for a remote (cross-node) source.

Runs on the channel's own gloo process group, never the pipeline's. The consumer pre-posts one
header receive per remote (ring, slot) (tag = slot's tag); when a header ``[seq, length, put_ns]``
arrives it receives the payload straight into that slot and only then stores the stamp in its
private mirror of the control words. Credits travel back as one-word messages on their own tags.
All process-group calls of a rank run on one progress thread, so ``put``/``release`` never block on
the network; sources on the consumer's own rank write their slots directly.
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

_HEADER, _PAYLOAD, _CREDIT = range(3)


class GlooTransport(Transport):
    name = "gloo"

    def open(self, layout: ChannelLayout, rank: int, group, device: torch.device) -> None:
        if group is None and any(r.source_rank != rank for r in layout.rings):
            raise ValueError("transport 'gloo' needs the channel's process group for remote sources")
        self.layout, self.rank, self.group = layout, rank, group
        self._consumer = rank == layout.consumer_rank
        self.ctrl = ControlBlock.private(len(layout.rings), layout.ring_depth)
        self._slots: dict[tuple[int, int], torch.Tensor] = {}
        if self._consumer:
            for r in layout.rings:
                for s in range(layout.ring_depth):
                    self._slots[(r.index, s)] = torch.empty(r.tap.max_shape, dtype=r.tap.dtype)
        self._outbox: queue.Queue = queue.Queue()
        self._pending_sends = 0
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._progress, name=f"tapchannel-gloo-rank{rank}", daemon=True)
        self._thread.start()

    # -- tags ------------------------------------------------------------------------------------
    def _tag(self, ring: RingId, slot: int, kind: int) -> int:
        return (ring.index * self.layout.ring_depth + slot) * 3 + kind

    # -- progress thread: the only caller of process-group operations ------------------------------
    def _progress(self) -> None:
        try:
            self._run_progress()
        except BaseException as exc:  # surfaced by the next call on the main thread
            self._error = exc

    def _run_progress(self) -> None:
        recvs = []  # (work, kind, ring, slot, buffer)
        if self._consumer:
            for r in self.layout.rings:
                if r.source_rank != self.rank:
                    for s in range(self.layout.ring_depth):
                        recvs.append(self._post_header(r, s))
        for r in self.layout.rings:
            if r.source_rank == self.rank and not self._consumer:
                for s in range(self.layout.ring_depth):
                    recvs.append(self._post_credit(r, s))
        sends = []  # (work, keep-alive tensors)
        while not self._stop.is_set():
            idle = True
            while True:
                try:
                    item = self._outbox.get_nowait()
                except queue.Empty:
                    break
                idle = False
                dst, parts = item
                for tensor, tag in parts:
                    sends.append((dist.isend(tensor, dst=dst, group=self.group, tag=tag), tensor))
            still = []
            for work, tensor in sends:
                if work.is_completed():
                    work.wait()
                    idle = False
                    with self._lock:
                        self._pending_sends -= 1
                else:
                    still.append((work, tensor))
            sends = still
            nxt = []
            for item in recvs:
                work, kind, ring, slot, buf = item
                if not work.is_completed():
                    nxt.append(item)
                    continue
                work.wait()
                idle = False
                w = self.ctrl.words[ring.index, slot]
                if kind == _HEADER:
                    seq, length, put_ns = (int(x) for x in buf)
                    dst = self._slots[(ring.index, slot)][:length]
                    dist.recv(dst, src=ring.source_rank, group=self.group, tag=self._tag(ring, slot, _PAYLOAD))
                    w[LENGTH], w[PUT_NS], w[PUBLISH_NS] = length, put_ns, time.monotonic_ns()
                    w[STAMP] = seq
                    nxt.append(self._post_header(ring, slot))
                else:
                    w[CREDIT] = int(buf[0])
                    nxt.append(self._post_credit(ring, slot))
            recvs = nxt
            if idle:
                time.sleep(50e-6)
        for work, _ in sends:
            work.wait()

    def _post_header(self, ring: RingId, slot: int):
        buf = torch.empty(3, dtype=torch.int64)
        return (dist.irecv(buf, src=ring.source_rank, group=self.group, tag=self._tag(ring, slot, _HEADER)),
                _HEADER, ring, slot, buf)

    def _post_credit(self, ring: RingId, slot: int):
        buf = torch.empty(1, dtype=torch.int64)
        return (dist.irecv(buf, src=self.layout.consumer_rank, group=self.group,
                           tag=self._tag(ring, slot, _CREDIT)), _CREDIT, ring, slot, buf)

    def _check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"gloo transport progress thread on rank {self.rank} failed: {self._error!r}")

    def _send(self, dst: int, parts) -> None:
        self._check()
        with self._lock:
            self._pending_sends += len(parts)
        self._outbox.put((dst, parts))

    # -- producer --------------------------------------------------------------------------------
    def publish(self, ring: RingId, slot: int, tensor: torch.Tensor, seq: int, put_ns: int) -> None:
        if tensor.device.type != "cpu":
            raise ValueError(f"transport 'gloo' carries CPU tensors; tap {ring.tap.name!r} is on {tensor.device}")
        n = tensor.shape[0]
        if self._consumer:  # a source on the draft's own rank: write the slot directly
            self._slots[(ring.index, slot)][:n].copy_(tensor)
            w = self.ctrl.words[ring.index, slot]
            w[LENGTH], w[PUT_NS], w[PUBLISH_NS] = n, put_ns, time.monotonic_ns()
            w[STAMP] = seq
            return
        header = torch.tensor([seq, n, put_ns], dtype=torch.int64)
        self._send(self.layout.consumer_rank, [(header, self._tag(ring, slot, _HEADER)),
                                               (tensor.contiguous(), self._tag(ring, slot, _PAYLOAD))])

    def credit(self, ring: RingId, slot: int) -> int:
        self._check()
        return int(self.ctrl.words[ring.index, slot, CREDIT])

    def flush(self) -> None:
        while True:
            self._check()
            with self._lock:
                if self._pending_sends == 0 and self._outbox.empty():
                    return
            time.sleep(1e-4)

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
            self._send(ring.source_rank, [(torch.tensor([seq], dtype=torch.int64),
                                           self._tag(ring, slot, _CREDIT))])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._slots = {}
        # Pre-posted receives that never matched are abandoned with the group (destroyed after this).
