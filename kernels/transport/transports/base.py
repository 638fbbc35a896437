"""The interface every TapChannel transport implements, plus pieces they share.

A transport moves payloads into the consumer's ring slots and makes the control words (see
``kernels.transport.control``) visible on the right side. It knows nothing of stamps' meaning,
timeouts or errors: ``TapChannel`` does the protocol and calls these hooks.

Producer side: ``publish(ring, slot, tensor, seq, put_ns)`` copies the payload, then writes LENGTH,
PUT_NS, PUBLISH_NS and finally STAMP, possibly later on a helper thread (non-blocking);
``credit(ring, slot)`` reads the last released seq. Consumer side: ``poll(ring, slot)`` returns
(stamp, length, put_ns, publish_ns); ``view(ring, slot, length)`` the payload; ``release`` returns
the credit. ``open`` is collective over the channel's own process group.
"""
from __future__ import annotations

import hashlib
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
import torch.distributed as dist

from kernels.transport.spec import ChannelLayout, RingId

ALIGN = 256


def arena_offsets(layout: ChannelLayout) -> tuple[dict[tuple[int, int], int], int]:
    """Byte offset of every (ring, slot) payload in one flat arena, and the arena's size."""
    offsets, pos = {}, 0
    for ring in layout.rings:
        for slot in range(layout.ring_depth):
            offsets[(ring.index, slot)] = pos
            pos += -(-ring.tap.max_nbytes // ALIGN) * ALIGN
    return offsets, max(pos, ALIGN)


def layout_digest(layout: ChannelLayout) -> str:
    """A short fingerprint of everything both sides derive the arena from (rings in order, their taps' shapes
    and dtypes, source ranks, ring depth, consumer rank, alignment): equal digests, equal arenas."""
    rings = [(r.index, r.stage, r.tap.name, r.tap.max_shape, str(r.tap.dtype), r.source_rank)
             for r in layout.rings]
    desc = repr((rings, layout.ring_depth, layout.consumer_rank, ALIGN))
    return hashlib.sha256(desc.encode()).hexdigest()[:16]


def slot_view(arena: torch.Tensor, offset: int, ring: RingId) -> torch.Tensor:
    """A typed ``max_shape`` view of one slot of a flat uint8 arena."""
    spec = ring.tap
    return arena[offset:offset + spec.max_nbytes].view(spec.dtype).view(spec.max_shape)


def broadcast_object(obj, src: int, group) -> object:
    """``obj`` from global rank ``src`` to every rank of ``group`` (None outside a group)."""
    if group is None:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


class Completer:
    """One background thread running callbacks in FIFO order once a CUDA event (or nothing) completes.

    Used to publish a stamp only after the payload copy has finished on a side stream, and to return
    a credit only after the consumer's kernels stopped reading the slot, without blocking the caller.
    """

    def __init__(self, name: str):
        self._q: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, event: torch.cuda.Event | None, fn: Callable[[], None], keep=None) -> None:
        if self._error is not None:
            raise RuntimeError(f"transport helper thread failed earlier: {self._error!r}")
        self._q.put((event, fn, keep))

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                self._q.task_done()
                return
            event, fn, _keep = item
            try:
                if event is not None:
                    event.synchronize()
                fn()
            except BaseException as exc:  # noqa: BLE001 - any failure is surfaced on the next submit/flush
                self._error = exc
            finally:
                self._q.task_done()

    def flush(self) -> None:
        self._q.join()
        if self._error is not None:
            raise RuntimeError(f"transport helper thread failed: {self._error!r}")

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=10)


class Transport(ABC):
    """Moves tap payloads into the consumer's rings. One instance per rank per channel."""

    name = "abstract"

    def __init__(self) -> None:
        self.layout: ChannelLayout | None = None
        self.rank = -1

    @abstractmethod
    def open(self, layout: ChannelLayout, rank: int, group, device: torch.device) -> None:
        """Allocate (consumer) or attach to (producers) the rings; collective over ``group``."""

    # producer side
    @abstractmethod
    def publish(self, ring: RingId, slot: int, tensor: torch.Tensor, seq: int, put_ns: int) -> None:
        """Copy ``tensor`` into the slot, then make (length, times, stamp) visible; may return early."""

    @abstractmethod
    def credit(self, ring: RingId, slot: int) -> int:
        """The last seq the consumer released from this slot (control.EMPTY if none)."""

    def flush(self) -> None:
        """Wait until every publish and release issued so far is visible to the other side."""

    # consumer side
    @abstractmethod
    def poll(self, ring: RingId, slot: int) -> tuple[int, int, int, int]:
        """(stamp, length, put_ns, publish_ns) of the slot as the consumer sees it now."""

    @abstractmethod
    def view(self, ring: RingId, slot: int, length: int) -> torch.Tensor:
        """The payload's valid rows, readable on the consumer's device (no copy where possible)."""

    @abstractmethod
    def release(self, ring: RingId, slot: int, seq: int) -> None:
        """Hand the slot back to the producer once the consumer's reads of it have finished."""

    def shutdown(self) -> None:
        """Stop helper threads; every rank of the channel calls it after flushing, concurrently."""

    def close(self) -> None:
        """Free or detach the rings. Sources close before the consumer frees the rings."""
