"""CUDA IPC transport (colocated GPU processes): the consumer allocates every ring in one device
arena and exports it with a CUDA IPC handle; each source maps the arena once and writes its slots
with device-to-device copies on a side stream (one-sided: the consumer is not involved). The stamp
is stored in a small shared-memory control block only after the copy's event has completed, by a
helper thread, so ``put`` returns as soon as the copy is enqueued. A release records an event on
the consumer's stream and returns the credit once the consumer's reads are done.

Same host only (CUDA IPC); processes must be started with spawn/forkserver.
"""
from __future__ import annotations

import time

import torch
from torch.multiprocessing.reductions import reduce_tensor

from kernels.transport.control import CREDIT, LENGTH, PUBLISH_NS, PUT_NS, STAMP, ControlBlock
from kernels.transport.spec import ChannelLayout, RingId
from kernels.transport.transports.base import Completer, Transport, arena_offsets, broadcast_object, slot_view

_DEVICE_ARG = 6  # position of the storage device in torch's rebuild_cuda_tensor arguments


class CudaIpcTransport(Transport):
    name = "cuda_ipc"

    def open(self, layout: ChannelLayout, rank: int, group, device: torch.device) -> None:
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"transport 'cuda_ipc' needs a CUDA device, got {device}")
        self.layout, self.rank, self.device = layout, rank, device
        self._consumer = rank == layout.consumer_rank
        offsets, size = arena_offsets(layout)
        n_rings, depth = len(layout.rings), layout.ring_depth
        payload = None
        if self._consumer:
            self.ctrl = ControlBlock.create_shared(n_rings, depth)
            self._arena = torch.empty(size, dtype=torch.uint8, device=device)
            fn, args = reduce_tensor(self._arena)
            payload = (self.ctrl.name, fn, args)
        payload = broadcast_object(payload, src=layout.consumer_rank, group=group)
        if not self._consumer:
            name, fn, args = payload
            self.ctrl = ControlBlock.attach_shared(name, n_rings, depth)
            args = list(args)
            args[_DEVICE_ARG] = device.index if device.index is not None else torch.cuda.current_device()
            self._arena = fn(*args)
        mine = [r for r in layout.rings if self._consumer or r.source_rank == rank]
        self._slots = {(r.index, s): slot_view(self._arena, offsets[(r.index, s)], r)
                       for r in mine for s in range(depth)}
        self._stream = torch.cuda.Stream(device=device)
        self._completer = Completer(f"tapchannel-ipc-rank{rank}")

    def publish(self, ring: RingId, slot: int, tensor: torch.Tensor, seq: int, put_ns: int) -> None:
        if tensor.device.type != "cuda":
            raise ValueError(f"transport 'cuda_ipc' carries CUDA tensors; tap {ring.tap.name!r} of stage "
                             f"{ring.stage} is on {tensor.device}")
        n = tensor.shape[0]
        dst = self._slots[(ring.index, slot)][:n]
        self._stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(self._stream):
            dst.copy_(tensor, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
        w = self.ctrl.words[ring.index, slot]

        def stamp() -> None:
            w[LENGTH], w[PUT_NS], w[PUBLISH_NS] = n, put_ns, time.monotonic_ns()
            w[STAMP] = seq

        self._completer.submit(done, stamp, keep=tensor)  # keep the source alive until copied

    def credit(self, ring: RingId, slot: int) -> int:
        return int(self.ctrl.words[ring.index, slot, CREDIT])

    def poll(self, ring: RingId, slot: int) -> tuple[int, int, int, int]:
        w = self.ctrl.words[ring.index, slot]
        stamp = int(w[STAMP])
        return stamp, int(w[LENGTH]), int(w[PUT_NS]), int(w[PUBLISH_NS])

    def view(self, ring: RingId, slot: int, length: int) -> torch.Tensor:
        return self._slots[(ring.index, slot)][:length]

    def release(self, ring: RingId, slot: int, seq: int) -> None:
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self.device))
        w = self.ctrl.words[ring.index, slot]

        def credit() -> None:
            w[CREDIT] = seq

        self._completer.submit(done, credit)

    def flush(self) -> None:
        self._completer.flush()

    def close(self) -> None:
        if getattr(self, "_completer", None) is not None:
            self._completer.flush()
            self._completer.close()
            self._completer = None
        self._slots = {}
        self._arena = None
        if getattr(self, "ctrl", None) is not None:
            self.ctrl.close()
            self.ctrl = None
