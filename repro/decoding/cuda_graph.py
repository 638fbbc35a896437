"""Capture a callable into a CUDA graph and replay it; run it eagerly on CPU, when disabled, or when capture fails.

``GraphedCallable(fn, name, enabled)`` wraps ``fn(*tensors, **settings)``. On CUDA (and ``enabled``) the first call
for a given key (the inputs' shapes, dtypes and devices, and the hashable ``settings``, which are baked into the
graph) warms ``fn`` up on a side stream (``capture_stream``), captures it into a ``torch.cuda.CUDAGraph`` over
static copies of the inputs, and keeps the outputs of the capture as static outputs; every call then copies its
inputs into the static buffers and replays. With ``persistent_inputs=True`` the caller promises to pass its own
long-lived buffers: the first call's tensors become the static inputs (no copies while the same tensors are passed
again). The returned outputs are the static ones: they are overwritten by the next replay (with
``shared_pool=True``, whose graphs share one memory pool, by the next call of any key).

Graphs of callables whose calls never overlap may share memory pools beyond that: inside ``shared_graph_pools()``,
each ``shared_pool`` callable made takes its pool by ``pool_key`` (its name unless given) from one ``GraphPools``, so
the engines of a lockstep's rows (``repro.rl.lockstep``), whose requests run one after another, hold each graphed
call's largest graph's temporaries once, not once an engine and request shape. What a call returns is then valid until
the next call of any callable of its pool key; under ``emulate_replay`` each call poisons the fresh outputs of the
other graphs of its pool (NaN, or an impossible integer), so a caller that reads an output after that fails on the CPU.

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
    with shared_graph_pools():        # engines built here share one pool per graphed call (rows taking turns)
        engines = [build(row) for row in rows]
"""
from __future__ import annotations

import contextlib
import gc
import logging
import weakref
from collections.abc import Callable, Hashable, Iterator
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


class GraphPools:
    """CUDA graph memory pools by key, for graphed callables whose calls never overlap (``shared_graph_pools``)."""

    def __init__(self):
        self._handles: dict[str, Any] = {}
        self._members: dict[str, weakref.WeakSet] = {}

    def join(self, key: str, callable_: "GraphedCallable") -> None:
        self._members.setdefault(key, weakref.WeakSet()).add(callable_)

    def members(self, key: str) -> list["GraphedCallable"]:
        """The callables that capture into ``key``'s pool."""
        return list(self._members.get(key, ()))

    def handle(self, key: str):
        """``key``'s pool (made on first use)."""
        if key not in self._handles:
            self._handles[key] = torch.cuda.graph_pool_handle()
        return self._handles[key]

    def discard(self, key: str, handle) -> None:
        """Forget ``key``'s pool if it is ``handle`` (a broken capture may leave it recording): the next capture of
        any member takes a fresh one; graphs already captured into it keep it."""
        if self._handles.get(key) is handle:
            del self._handles[key]

    def keys(self) -> list[str]:
        return list(self._handles)

    def segment_bytes(self, segments: list[dict]) -> dict[str, int]:
        """Bytes each key's pool holds among ``segments`` (``torch.cuda.memory_snapshot()``'s)."""
        key_of = {tuple(h): k for k, h in self._handles.items()}
        held = dict.fromkeys(self._handles, 0)
        for seg in segments:
            key = key_of.get(tuple(seg.get("segment_pool_id", (0, 0))))
            if key is not None:
                held[key] += seg["total_size"]
        return held


_ACTIVE_POOLS: list[GraphPools] = []


def active_graph_pools() -> GraphPools | None:
    """The ``GraphPools`` of the innermost ``shared_graph_pools()`` now open, if any."""
    return _ACTIVE_POOLS[-1] if _ACTIVE_POOLS else None


@contextlib.contextmanager
def shared_graph_pools(pools: GraphPools | None = None) -> Iterator[GraphPools]:
    """Every ``shared_pool`` GraphedCallable made inside takes its pool from ``pools`` (a new ``GraphPools`` if
    none) by its ``pool_key``, for its whole life. Only for callables that never run while another of the same key
    still needs its outputs: the rollout engines of rows that take turns, each request's outputs read within it."""
    pools = pools if pools is not None else GraphPools()
    _ACTIVE_POOLS.append(pools)
    try:
        yield pools
    finally:
        _ACTIVE_POOLS.remove(pools)


def _tensors(x: Any) -> list[torch.Tensor]:
    """The tensors in a call's outputs (tensors, possibly nested in tuples/lists, or None)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _tensors(item)]
    return []


def _poison(t: torch.Tensor) -> None:
    """Overwrite an emulated graph's output as another graph of its pool may: NaN, or an impossible integer."""
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.logical_not_()
    else:
        t.fill_(torch.iinfo(t.dtype).min)


def _copy_into(dst: Any, src: Any) -> None:
    """Copy a call's outputs (tensors, possibly nested in tuples/lists, or None) into the static ones."""
    for d, s in zip(_tensors(dst), _tensors(src)):
        d.copy_(s)


def graph_pool_bytes(segments: list[dict]) -> int:
    """Bytes the CUDA graph pools hold among ``segments`` (``torch.cuda.memory_snapshot()``'s; the ordinary pool's
    id is ``(0, 0)``)."""
    return sum(seg["total_size"] for seg in segments if tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0))


class GraphedCallable:
    total_captures = 0       # every capture in this process (trainers log it: train/graph_captures)
    captured: list[str] = []  # the name of each of those captures, in order (a trainer names a step's own)
    emulate_replay = False   # tests: replay semantics on CPU (see the module docstring)

    def __init__(self, fn: Callable[..., Any], name: str, *, enabled: bool = True, warmup: int = 2,
                 persistent_inputs: bool = False, shared_pool: bool = False, pool_key: str | None = None):
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (lazy initialisation must happen before capture), got {warmup}")
        self.fn, self.name, self.enabled, self.warmup = fn, name, enabled, warmup
        self.persistent_inputs = persistent_inputs
        # shared_pool: this callable's graphs (one per key) allocate from one memory pool, so its memory is the
        # largest graph's, not their sum. Safe because they replay one at a time on one stream and a call's
        # outputs are read before the next call (of any key) overwrites them
        self.shared_pool = shared_pool
        self._pool = None
        # inside shared_graph_pools(): the pool is the registry's for pool_key, shared with other callables
        self.pool_key = pool_key or name
        self._registry = active_graph_pools() if shared_pool else None
        if self._registry is not None:
            self._registry.join(self.pool_key, self)
        self.fallback_reason: str | None = None
        self.captures = 0
        self.replays = 0
        self.eager_calls = 0
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, list[torch.Tensor], Any]] = {}
        self._fresh_outputs: dict[Hashable, list[torch.Tensor]] = {}     # emulation: outputs a replay may overwrite

    def reset(self) -> None:
        """Forget every captured graph (call when the persistent tensors ``fn`` writes are reallocated)."""
        self._graphs.clear()
        self._fresh_outputs.clear()
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
                if self._registry is not None and self._pool is not None:
                    self._registry.discard(self.pool_key, self._pool)
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
        self._poison_pool_peers(k)
        if entry is None:
            static_in = list(inputs) if self.persistent_inputs else [x.clone() for x in inputs]
            for _ in range(self.warmup - 1):
                self.fn(*static_in, **settings)
            before = _tensors(self.fn(*static_in, **settings))      # kept alive: a fresh output cannot reuse it
            static_out = self.fn(*static_in, **settings)
            # the outputs the capture allocated (in the graph's pool on a GPU), not tensors fn hands back from
            # elsewhere (its inputs, persistent buffers): those a call returns at the same address every time
            kept = {t.untyped_storage().data_ptr() for t in before}
            fresh = [t for t in _tensors(static_out) if t.untyped_storage().data_ptr() not in kept]
            entry = self._graphs[k] = (None, static_in, static_out)
            self._fresh_outputs[k] = fresh
            self._count_capture()
            return static_out
        _, static_in, static_out = entry
        for s, x in zip(static_in, inputs):
            if s is not x:
                s.copy_(x)
        _copy_into(static_out, self.fn(*static_in, **settings))
        self.replays += 1
        return static_out

    def pool_peers(self) -> list["GraphedCallable"]:
        """The callables whose graphs share this one's memory pool (itself included; none without ``shared_pool``)."""
        if not self.shared_pool:
            return []
        return self._registry.members(self.pool_key) if self._registry is not None else [self]

    def _poison_pool_peers(self, key: Hashable) -> None:
        """Emulation: a graph's replay may overwrite what the other graphs of its pool returned."""
        for peer in self.pool_peers():
            for k, outs in peer._fresh_outputs.items():
                if peer is not self or k != key:
                    for t in outs:
                        _poison(t)

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
            self._pool = (self._registry.handle(self.pool_key) if self._registry is not None
                          else torch.cuda.graph_pool_handle())
        return self._pool if self.shared_pool else None

    @property
    def pools(self) -> int:
        """Memory pools this callable's graphs hold: one in all with ``shared_pool``, else one a graph."""
        return min(len(self._graphs), 1) if self.shared_pool else len(self._graphs)

    def status(self) -> dict:
        return {"enabled": self.enabled, "captures": self.captures, "replays": self.replays,
                "eager_calls": self.eager_calls, "fallback_reason": self.fallback_reason, "graphs": len(self._graphs),
                "pools": self.pools}
