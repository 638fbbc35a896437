"""CUDA IPC transport (colocated GPU processes): the consumer allocates every ring in one device
arena and shares it with the sources once; each source writes its slots with device-to-device copies
on a side stream (one-sided: the consumer is not involved). The stamp is stored in a small
shared-memory control block only after the copy's event has completed, by a helper thread, so
``put`` returns as soon as the copy is enqueued. A release records an event on the consumer's stream
and returns the credit once the consumer's reads are done.

The arena travels through torch.multiprocessing's CUDA tensor sharing, the path torch documents
("Multiprocessing best practices", sharing CUDA tensors): importing ``torch.multiprocessing`` registers
its reducers with ``multiprocessing.reduction.ForkingPickler``, which turns a CUDA tensor into bytes
holding a CUDA IPC handle of its allocation, its offset and a shared reference count (the bytes a
torch.multiprocessing Queue or Pipe carries). The consumer pickles the arena once per source rank and
broadcasts the bytes over the channel's group; each source unpickles its copy into a tensor mapped
onto the same memory. torch 2.11-2.13 have no public call that hands out a raw ``cudaIpcMemHandle``
(``UntypedStorage._share_cuda_`` and the argument tuple of ``reduce_tensor``'s rebuild function are
internals), so the pickled form is the contract used here.

The rebuilt tensor lives on the device index the consumer allocated it on, so every process must see
the GPUs under the same indices (one launcher per node does; differing CUDA_VISIBLE_DEVICES do not).
The handshake carries the consumer GPU's UUID, the arena's size and a digest of the channel layout; a
source refuses, naming both sides, when its device of that index has another UUID or it derived a
different layout. A source on another GPU of the node copies peer to peer into the consumer's GPU.

Same host only (CUDA IPC); processes must be started with spawn/forkserver (or separately).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing  # noqa: F401 - registers torch's tensor reducers with ForkingPickler

from kernels.transport.control import CREDIT, LENGTH, PUBLISH_NS, PUT_NS, STAMP, ControlBlock
from kernels.transport.spec import ChannelLayout, RingId, TapChannelError
from kernels.transport.transports.base import (
    Completer,
    Transport,
    arena_offsets,
    broadcast_object,
    layout_digest,
    slot_view,
)


def device_uuid(device: torch.device) -> str:
    """The physical identity of ``device``: the GPU's UUID (``"cpu"`` for the host)."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    props = torch.cuda.get_device_properties(device)
    return str(getattr(props, "uuid", f"{props.name} (no UUID)"))


@dataclass(frozen=True)
class ArenaOffer:
    """What the consumer broadcasts: its control block's name, the arena pickled once per source rank by
    torch.multiprocessing's reducers, and what a source checks before mapping it."""

    ctrl_name: str | None
    layout_digest: str
    nbytes: int
    device_uuid: str
    arenas: dict[int, bytes]


def offer_arena(arena: torch.Tensor, ctrl_name: str | None, layout: ChannelLayout) -> ArenaOffer:
    """The consumer's side of the handshake for ``arena`` (flat uint8, ``arena_offsets(layout)`` bytes)."""
    _, size = arena_offsets(layout)
    if arena.dtype != torch.uint8 or arena.dim() != 1 or arena.numel() != size:
        raise ValueError(f"arena of dtype {arena.dtype}, shape {tuple(arena.shape)}: expected a flat uint8 "
                         f"tensor of {size} bytes for this layout")
    sources = sorted({r.source_rank for r in layout.rings} - {layout.consumer_rank})
    # one pickle per receiver: each carries its own share of the allocation's reference count
    return ArenaOffer(ctrl_name, layout_digest(layout), size, device_uuid(arena.device),
                      {rank: bytes(ForkingPickler.dumps(arena)) for rank in sources})


def accept_arena(offer: ArenaOffer, layout: ChannelLayout, rank: int) -> torch.Tensor:
    """A source's side of the handshake: the consumer's arena mapped into this process, after checking
    that both sides derived the same layout and that the mapping landed on the consumer's GPU."""
    _, size = arena_offsets(layout)
    mine = layout_digest(layout)
    if offer.layout_digest != mine or offer.nbytes != size:
        raise TapChannelError(
            f"cuda_ipc rank {rank}: draft rank {layout.consumer_rank} offers an arena of {offer.nbytes} "
            f"bytes for layout {offer.layout_digest}, this rank derives {size} bytes for layout {mine}: "
            "the ranks built different ChannelLayouts (tap shapes, dtypes, ring depth or stage "
            "placement differ)")
    if rank not in offer.arenas:
        raise TapChannelError(f"cuda_ipc rank {rank}: the draft's offer has no share for this rank (it "
                              f"serves source ranks {sorted(offer.arenas)})")
    try:
        arena = ForkingPickler.loads(offer.arenas[rank])
    except Exception as exc:  # noqa: BLE001 - the cause is named in the error
        raise TapChannelError(f"cuda_ipc rank {rank}: could not map draft rank {layout.consumer_rank}'s "
                              "arena (CUDA IPC needs both processes on one host, on GPUs they can both "
                              f"see): {type(exc).__name__}: {exc}") from exc
    got = device_uuid(arena.device)
    if got != offer.device_uuid:
        raise TapChannelError(
            f"cuda_ipc rank {rank}: the draft's arena was allocated on device {offer.device_uuid}, but "
            f"{arena.device} in this process is device {got}: every process of the channel must see the "
            "GPUs under the same indices (same CUDA_VISIBLE_DEVICES)")
    if arena.dtype != torch.uint8 or arena.numel() != size:
        raise TapChannelError(f"cuda_ipc rank {rank}: the mapped arena is {arena.dtype} x {arena.numel()}, "
                              f"expected uint8 x {size}")
    return arena


class CudaIpcTransport(Transport):
    name = "cuda_ipc"

    def open(self, layout: ChannelLayout, rank: int, group, device: torch.device) -> None:
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"transport 'cuda_ipc' needs a CUDA device, got {device}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        offer, ctrl, arena = None, None, None
        if rank == layout.consumer_rank:
            ctrl = ControlBlock.create_shared(len(layout.rings), layout.ring_depth)
            arena = torch.empty(arena_offsets(layout)[1], dtype=torch.uint8, device=device)
            offer = offer_arena(arena, ctrl.name, layout)
        offer = broadcast_object(offer, src=layout.consumer_rank, group=group)
        if rank != layout.consumer_rank:
            arena = accept_arena(offer, layout, rank)
            ctrl = ControlBlock.attach_shared(offer.ctrl_name, len(layout.rings), layout.ring_depth)
        self._attach(layout, rank, device, ctrl, arena)
        self._stream = torch.cuda.Stream(device=device)

    def _attach(self, layout: ChannelLayout, rank: int, device: torch.device, ctrl: ControlBlock,
                arena: torch.Tensor) -> None:
        """Slot views of this rank's rings over the shared arena and control words (after the handshake)."""
        self.layout, self.rank, self.device = layout, rank, torch.device(device)
        self._consumer = rank == layout.consumer_rank
        self.ctrl, self._arena = ctrl, arena
        offsets, _ = arena_offsets(layout)
        mine = [r for r in layout.rings if self._consumer or r.source_rank == rank]
        self._slots = {(r.index, s): slot_view(arena, offsets[(r.index, s)], r)
                       for r in mine for s in range(layout.ring_depth)}
        self._completer = Completer(f"tapchannel-ipc-rank{rank}")

    # -- the device work: a copy on the side stream, the end of the consumer's reads ------------------
    def _copy_async(self, dst: torch.Tensor, src: torch.Tensor):
        """``dst.copy_(src)`` on the side stream after the producer's pending work; an event marks its end."""
        self._stream.wait_stream(torch.cuda.current_stream(src.device))
        with torch.cuda.stream(self._stream):
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
        return done

    def _reads_done(self):
        """An event after every kernel the consumer has enqueued so far (its reads of a slot among them)."""
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self.device))
        return done

    def publish(self, ring: RingId, slot: int, tensor: torch.Tensor, seq: int, put_ns: int) -> None:
        if tensor.device.type != self.device.type:
            raise ValueError(f"transport 'cuda_ipc' carries {self.device.type} tensors; tap "
                             f"{ring.tap.name!r} of stage {ring.stage} is on {tensor.device}")
        n = tensor.shape[0]
        done = self._copy_async(self._slots[(ring.index, slot)][:n], tensor)
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
        done = self._reads_done()
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
        device = getattr(self, "device", None)
        if device is not None and device.type == "cuda" and getattr(self, "_consumer", False):
            torch.cuda.ipc_collect()   # free the arena once the sources' mappings are gone
