"""Capture a callable into a CUDA graph and replay it; run it eagerly on CPU, when disabled, or when capture fails.

``GraphedCallable(fn, name, enabled)`` wraps ``fn(*tensors, **settings)``. On CUDA (and ``enabled``) the first call
for a given key (the inputs' shapes, dtypes and devices, and the hashable ``settings``, which are baked into the
graph) warms ``fn`` up on a side stream (``capture_stream``), captures it into a ``torch.cuda.CUDAGraph`` over
static copies of the inputs, and keeps the outputs of the capture as static outputs; every call then copies its
inputs into the static buffers and replays. With ``persistent_inputs=True`` the caller promises to pass its own
long-lived buffers: the first call's tensors become the static inputs (no copies while the same tensors are passed
again). The returned outputs are the static ones: they are overwritten by the next replay (with
``shared_pool=True``, whose graphs share one memory pool, by the next call of any key).

``fn`` must be replay-safe: it may write into persistent tensors (caches), but the same inputs must give the same
writes (the warm-up runs it for real before the replay runs it again); it must not synchronise with the host, copy
CPU tensors it creates to the device, or skip work through a memo keyed on tensor identity. A failed capture never
fails the run: the reason is logged once, kept in ``fallback_reason``, and the callable runs eagerly (until
``reset()``). ``GraphedCallable.emulate_replay = True`` (tests, CPU) gives static inputs and outputs as a replay
would, so a caller that passes a new tensor where the graph writes in place, or keeps an output across calls, goes
wrong on the CPU as on a GPU.

    step = GraphedCallable(lambda x: model(x), "draft.propose", enabled=True)
    y = step(x, greedy=True)          # eager on CPU; captured once per input shape on CUDA, then replayed
    step.fallback_reason              # None, or why capture failed
"""
from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable, Hashable
from typing import Any

import torch

log = logging.getLogger(__name__)
CAPTURE_ATTEMPTS = 2     # a capture that fails is tried once more before the callable runs eagerly


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def capture_stream() -> torch.cuda.Stream:
    """The one side stream of the current device on which every graph of this process warms up and is captured.

    One stream, not a fresh one per capture: cuBLAS keeps a workspace per (handle, stream), allocated on the
    stream's first matrix product. Warmed up on this stream outside any capture, that workspace comes from the
    ordinary pool and outlives every graph. With a fresh stream per capture it would be allocated inside the capture,
    from the graph's private pool; torch hands out streams round-robin from a small pool, so a later capture on a
    recycled stream would find its workspace in the freed pool of a graph long gone.
    """
    dev = torch.cuda.current_device()
    if dev not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[dev] = torch.cuda.Stream()
    return _CAPTURE_STREAMS[dev]


@contextlib.contextmanager
def capture_into(graph: torch.cuda.CUDAGraph, pool=None):
    """Record the enclosed CUDA work into ``graph`` on ``capture_stream()`` (the graph gets its own memory pool, or
    allocates from ``pool``, a ``torch.cuda.graph_pool_handle()`` other graphs share).

    Unlike ``torch.cuda.graph()``, this does not empty the caching allocator and the pinned-host cache before the
    capture, so the eager work after a capture (the next policy update) keeps its cached memory instead of
    allocating it again with ``cudaMalloc``.

    Python's cyclic garbage collector is off during the capture: a collection there frees whatever dead cycles
    hold, among them other engines' ``CUDAGraph`` objects, and destroying a graph is not permitted while a stream
    captures (the capture is invalidated: "operation not permitted when stream is capturing").
    """
    torch.cuda.synchronize()
    stream = capture_stream()
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=pool)
            try:
                yield graph
            except BaseException:
                with contextlib.suppress(Exception):     # the capture is already broken: keep the original error
                    graph.capture_end()
                raise
            graph.capture_end()
    finally:
        if collecting:
            gc.enable()


def _copy_into(dst: Any, src: Any) -> None:
    """Copy a call's outputs (tensors, possibly nested in tuples/lists, or None) into the static ones."""
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, (tuple, list)):
        for d, s in zip(dst, src):
            _copy_into(d, s)


class GraphedCallable:
    total_captures = 0       # every capture in this process (trainers log it: train/graph_captures)
    captured: list[str] = []  # the name of each of those captures, in order (a trainer names a step's own)
    emulate_replay = False   # tests: replay semantics on CPU (see the module docstring)

    def __init__(self, fn: Callable[..., Any], name: str, *, enabled: bool = True, warmup: int = 2,
                 persistent_inputs: bool = False, shared_pool: bool = False):
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (lazy initialisation must happen before capture), got {warmup}")
        self.fn, self.name, self.enabled, self.warmup = fn, name, enabled, warmup
        self.persistent_inputs = persistent_inputs
        # shared_pool: this callable's graphs (one per key) allocate from one memory pool, so its memory is the
        # largest graph's, not their sum. Safe because they replay one at a time on one stream and a call's
        # outputs are read before the next call (of any key) overwrites them
        self.shared_pool = shared_pool
        self._pool = None
        self.fallback_reason: str | None = None
        self.captures = 0
        self.replays = 0
        self.eager_calls = 0
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, list[torch.Tensor], Any]] = {}

    def reset(self) -> None:
        """Forget every captured graph (call when the persistent tensors ``fn`` writes are reallocated)."""
        self._graphs.clear()
        self.fallback_reason = None

    @staticmethod
    def graph_key(inputs: tuple[torch.Tensor, ...], settings: dict[str, Hashable]) -> Hashable:
        return (tuple((tuple(t.shape), t.dtype, str(t.device)) for t in inputs), tuple(sorted(settings.items())))

    def would_capture(self, inputs: tuple[torch.Tensor, ...]) -> bool:
        return (self.enabled and self.fallback_reason is None and torch.cuda.is_available()
                and len(inputs) > 0 and all(t.is_cuda for t in inputs))

    def __call__(self, *inputs: torch.Tensor, **settings: Hashable) -> Any:
        if not self.would_capture(inputs):
            if self.enabled and GraphedCallable.emulate_replay and inputs:
                return self._emulated(inputs, settings)
            self.eager_calls += 1
            return self.fn(*inputs, **settings)
        k = self.graph_key(inputs, settings)
        entry = self._graphs.get(k)
        if entry is None:
            entry = self._capture_or_fall_back(inputs, settings)
            if entry is None:
                self.eager_calls += 1
                return self.fn(*inputs, **settings)
            self._graphs[k] = entry
            self._count_capture()
        graph, static_in, static_out = entry
        for s, x in zip(static_in, inputs):
            if s is not x:
                s.copy_(x)
        graph.replay()
        self.replays += 1
        return static_out

    def _count_capture(self) -> None:
        self.captures += 1
        GraphedCallable.total_captures += 1
        GraphedCallable.captured.append(self.name)

    def _capture_or_fall_back(self, inputs: tuple[torch.Tensor, ...], settings: dict[str, Hashable]):
        """Capture (warm-up included), once more if the first attempt fails; None (and ``fallback_reason`` set)
        when both fail. Between the attempts the device is synchronised (and, after running out of memory, the
        allocator's cached free memory released); the second attempt warms up again, so lazy work that the first
        did inside its capture (a kernel's first load, an allocation) is done before it."""
        for attempt in range(1, CAPTURE_ATTEMPTS + 1):
            try:
                return self._capture(inputs, settings)
            except Exception as exc:                 # noqa: BLE001 - any capture failure falls back to eager
                reason = f"{type(exc).__name__}: {exc}"
                with contextlib.suppress(Exception):  # let a broken capture's pending work finish first
                    torch.cuda.synchronize()
                # a broken capture can leave the allocator recording into its pool: capturing into that pool again
                # fails ("beginAllocateToPool: already recording to mempool_id"), so the retry takes a fresh one
                self._pool = None
                if isinstance(exc, torch.OutOfMemoryError):
                    # a graph's pool cannot use the ordinary pool's cached free blocks: hand them back to the
                    # driver, so the retry's pool can have that memory
                    with contextlib.suppress(Exception):
                        torch.cuda.empty_cache()
                if attempt < CAPTURE_ATTEMPTS:
                    log.warning("CUDA graph capture of %s did not succeed (attempt %d of %d), trying again: %s",
                                self.name, attempt, CAPTURE_ATTEMPTS, reason)
        self.fallback_reason = reason
        log.warning("CUDA graph capture of %s failed; running it eagerly: %s", self.name, reason)
        return None

    def _emulated(self, inputs: tuple[torch.Tensor, ...], settings: dict[str, Hashable]) -> Any:
        k = self.graph_key(inputs, settings)
        entry = self._graphs.get(k)
        if entry is None:
            static_in = list(inputs) if self.persistent_inputs else [x.clone() for x in inputs]
            for _ in range(self.warmup):
                self.fn(*static_in, **settings)
            entry = self._graphs[k] = (None, static_in, self.fn(*static_in, **settings))
            self._count_capture()
            return entry[2]
        _, static_in, static_out = entry
        for s, x in zip(static_in, inputs):
            if s is not x:
                s.copy_(x)
        _copy_into(static_out, self.fn(*static_in, **settings))
        self.replays += 1
        return static_out

    def _capture(self, inputs: tuple[torch.Tensor, ...], settings: dict[str, Hashable]):
        static_in = list(inputs) if self.persistent_inputs else [x.clone() for x in inputs]
        side = capture_stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.fn(*static_in, **settings)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with capture_into(graph, self.capture_pool()):
            static_out = self.fn(*static_in, **settings)
        return graph, static_in, static_out

    def capture_pool(self):
        """The memory pool the next capture allocates from: this callable's shared one, or None (a pool of its own)."""
        if self.shared_pool and self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool if self.shared_pool else None

    @property
    def pools(self) -> int:
        """Memory pools this callable's graphs hold: one in all with ``shared_pool``, else one a graph."""
        return min(len(self._graphs), 1) if self.shared_pool else len(self._graphs)

    def status(self) -> dict:
        return {"enabled": self.enabled, "captures": self.captures, "replays": self.replays,
                "eager_calls": self.eager_calls, "fallback_reason": self.fallback_reason, "graphs": len(self._graphs),
                "pools": self.pools}
