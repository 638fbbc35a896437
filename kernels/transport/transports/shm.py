"""Shared-memory transport (CPU, colocated processes): the consumer's rings live in one POSIX shared
memory arena that every source maps; the control words live in a second segment. A put is one copy
into the slot followed by the stamp store (x86 keeps store order), so it is a one-sided write.

``HostStagingTransport`` is the baseline the paper compares against: every payload goes device ->
private pinned host buffer (the producer waits for it) -> shared host memory -> private host buffer
-> device (the consumer waits for it). On CPU the device legs become plain extra copies.
"""
from __future__ import annotations

import shutil
import time
from multiprocessing import shared_memory

import torch

from kernels.transport.control import (
    CREDIT,
    LENGTH,
    PUBLISH_NS,
    PUT_NS,
    STAMP,
    ControlBlock,
    attach_shm,
    close_shm,
)
from kernels.transport.spec import ChannelLayout, RingId
from kernels.transport.transports.base import Transport, arena_offsets, broadcast_object, slot_view


def _check_shm_space(nbytes: int, path: str = "/dev/shm") -> None:
    """Refuse rings larger than the shared-memory filesystem: writing past it kills with SIGBUS."""
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return
    if nbytes > free:
        raise MemoryError(f"TapChannel rings need {nbytes / 2**20:.0f} MiB of shared memory but {path} has "
                          f"{free / 2**20:.0f} MiB free; lower ring_depth or the tap sizes")


class SharedMemoryTransport(Transport):
    name = "shm"

    def open(self, layout: ChannelLayout, rank: int, group, device: torch.device) -> None:
        self.layout, self.rank, self.device = layout, rank, torch.device(device)
        self._consumer = rank == layout.consumer_rank
        offsets, size = arena_offsets(layout)
        n_rings, depth = len(layout.rings), layout.ring_depth
        names = None
        if self._consumer:
            _check_shm_space(size)
            self.ctrl = ControlBlock.create_shared(n_rings, depth)
            self._arena_shm = shared_memory.SharedMemory(create=True, size=size)
            names = (self.ctrl.name, self._arena_shm.name)
        names = broadcast_object(names, src=layout.consumer_rank, group=group)
        if not self._consumer:
            self.ctrl = ControlBlock.attach_shared(names[0], n_rings, depth)
            self._arena_shm = attach_shm(names[1])
        arena = torch.frombuffer(self._arena_shm.buf, dtype=torch.uint8, count=size)
        mine = [r for r in layout.rings if self._consumer or r.source_rank == rank]
        self._slots = {(r.index, s): slot_view(arena, offsets[(r.index, s)], r)
                       for r in mine for s in range(depth)}
        del arena

    def _write_payload(self, ring: RingId, slot: int, tensor: torch.Tensor) -> None:
        if tensor.device.type != "cpu":
            raise ValueError(f"transport 'shm' carries CPU tensors only; tap {ring.tap.name!r} of stage "
                             f"{ring.stage} is on {tensor.device} (use cuda_ipc or host_staging)")
        self._slots[(ring.index, slot)][: tensor.shape[0]].copy_(tensor)

    def publish(self, ring: RingId, slot: int, tensor: torch.Tensor, seq: int, put_ns: int) -> None:
        self._write_payload(ring, slot, tensor)
        w = self.ctrl.words[ring.index, slot]
        w[LENGTH], w[PUT_NS], w[PUBLISH_NS] = tensor.shape[0], put_ns, time.monotonic_ns()
        w[STAMP] = seq  # last: the consumer trusts the payload once it sees the stamp

    def credit(self, ring: RingId, slot: int) -> int:
        return int(self.ctrl.words[ring.index, slot, CREDIT])

    def poll(self, ring: RingId, slot: int) -> tuple[int, int, int, int]:
        w = self.ctrl.words[ring.index, slot]
        stamp = int(w[STAMP])  # read the stamp before the fields it guards
        return stamp, int(w[LENGTH]), int(w[PUT_NS]), int(w[PUBLISH_NS])

    def view(self, ring: RingId, slot: int, length: int) -> torch.Tensor:
        return self._slots[(ring.index, slot)][:length]

    def release(self, ring: RingId, slot: int, seq: int) -> None:
        self.ctrl.words[ring.index, slot, CREDIT] = seq

    def close(self) -> None:
        self._slots = {}
        if getattr(self, "ctrl", None) is not None:
            self.ctrl.close()
            self.ctrl = None
        if getattr(self, "_arena_shm", None) is not None:
            close_shm(self._arena_shm, unlink=self._consumer)
            self._arena_shm = None


class HostStagingTransport(SharedMemoryTransport):
    """Baseline: device -> pinned host -> shared host memory -> host -> device, synchronous at each end."""

    name = "host_staging"

    def open(self, layout: ChannelLayout, rank: int, group, device: torch.device) -> None:
        super().open(layout, rank, group, device)
        cuda = self.device.type == "cuda"
        self._stage_out: dict[int, torch.Tensor] = {}
        self._land: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        for r in layout.rings:
            if r.source_rank == rank:
                self._stage_out[r.index] = torch.empty(r.tap.max_shape, dtype=r.tap.dtype, pin_memory=cuda)
            if self._consumer:
                for s in range(layout.ring_depth):
                    host = torch.empty(r.tap.max_shape, dtype=r.tap.dtype, pin_memory=cuda)
                    dev = (torch.empty(r.tap.max_shape, dtype=r.tap.dtype, device=self.device) if cuda
                           else host)
                    self._land[(r.index, s)] = (host, dev)

    def _write_payload(self, ring: RingId, slot: int, tensor: torch.Tensor) -> None:
        n = tensor.shape[0]
        staged = self._stage_out[ring.index][:n]
        if tensor.device.type == "cuda":
            staged.copy_(tensor, non_blocking=True)
            torch.cuda.current_stream(tensor.device).synchronize()  # the producer waits for its D2H
        else:
            staged.copy_(tensor)
        self._slots[(ring.index, slot)][:n].copy_(staged)

    def view(self, ring: RingId, slot: int, length: int) -> torch.Tensor:
        host, dev = self._land[(ring.index, slot)]
        host[:length].copy_(self._slots[(ring.index, slot)][:length])
        if dev is host:
            return host[:length]
        dev[:length].copy_(host[:length], non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()  # the consumer waits for its H2D
        return dev[:length]

    def close(self) -> None:
        self._stage_out, self._land = {}, {}
        super().close()
