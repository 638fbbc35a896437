"""Static-shape draft caches for CUDA-graphed proposers: preallocated slots, written at device indices.

``StaticSlots(batch, max_slots, device)`` holds the token position of every slot ``[B, S_max]`` (-1:
dead or unused) with the visibility rule of ``repro.decoding.kv.SlotTable.visible`` (live, position
<= query position). ``StaticKV`` holds one draft layer's keys/values ``[B, G, S_max, D]``. Writes go
to columns ``cursor + j`` where ``cursor`` is a device scalar, so a captured graph can write at a
different place on each replay; attention always runs over all ``S_max`` slots under the mask, so
every shape is static. Nothing is trimmed or compacted: ``S_max`` is sized for the whole request
(``slots_needed``), and ``Cursor`` refuses (on the host, without a device sync) any write past it.
Attention reads the first ``view`` columns (``StaticSlots.view``: the used ones rounded up to
``VIEW_BUCKET``, ``view_columns``), a host-side number that keys the captured graphs.

    slots, kv = StaticSlots(2, 64, "cpu"), StaticKV(2, 2, 64, 16, torch.float32, "cpu")
    cols = slots.write(cursor_tensor, positions, live)      # positions/live [B, q]
    kv.write(cols, k, v)                                    # k/v [B, q, G, D]
    vis = slots.visible(q_pos)                              # [B, q, S_max]
"""
from __future__ import annotations

import contextlib
import gc
import inspect
from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch

from repro.decoding.cuda_graph import GraphedCallable
from repro.decoding.kv import slot_visible

SLOT_BUCKET = 256   # S_max is rounded up to this, so similar requests reuse buffers (and captured graphs)
VIEW_BUCKET = 64    # attention reads the used columns rounded up to this (one captured graph per bucket)


def view_columns(used: int, max_slots: int, bucket: int = VIEW_BUCKET) -> int:
    """Columns attention reads when ``used`` are written: rounded up to ``bucket``, at most ``max_slots``."""
    return max(1, min(max_slots, -(-used // bucket) * bucket))


def slots_needed(prompt_len: int, max_new_tokens: int, num_proposals: int) -> int:
    """Columns a request writes: the prompt, then k+1 per verify step (at most max_new_tokens - 1 steps:
    the first token comes from the prefill and every step commits at least one)."""
    return prompt_len + max(max_new_tokens - 1, 0) * (num_proposals + 1)


def bucketed(n: int) -> int:
    return -(-n // SLOT_BUCKET) * SLOT_BUCKET


def batch_bucket(n: int) -> int:
    """The static batch a request of ``n`` rows runs in when the engine buckets batches: the next power of two, at
    least two. Multi-turn rollouts shrink the batch turn by turn; bucketed, a few states (and their captured graphs)
    serve every turn instead of one capture per distinct batch size. Never one row: dynamo specializes a size of 1,
    so a one-row state is a compilation of its own, made in whichever later turn first has one row left."""
    if n < 1:
        raise ValueError(f"batch must be >= 1, got {n}")
    return max(2, 1 << (n - 1).bit_length())


_COMPILE_ARGS = frozenset(inspect.signature(torch.compile).parameters)
WHOLE_RECOMPILE_LIMIT = 64     # graphs of one whole-step function: a CPU compiles one per batch state
# the integer arguments of the engine's whole-step functions that grow during a request: their attention views
VIEW_ARGS = ("view", "draft_views")


def _sources(names: tuple[str, ...]) -> str:
    """dynamo's ``dynamic_sources`` pattern for the integer arguments ``names``."""
    return ",".join(rf"L\['{name}'\].*" for name in names)


@contextlib.contextmanager
def symbolic_views():
    """Inside the block, ``traced_whole``'s functions on a CPU see their ``VIEW_ARGS`` as symbolic without setting
    dynamo's ``dynamic_sources`` around each call: a request's decode loop enters it once. (Changing that setting
    at every call cost a fused step of the cpu-tiny decode policy its fast path: 0.06-0.17 ms of about 0.9.)"""
    with torch.compiler.config.patch(dynamic_sources=_sources(VIEW_ARGS)):
        yield


def traced_whole(fn: Callable, backend: str = "inductor", *, device: torch.device | str,
                 dynamic_ints: tuple[str, ...] = ()) -> Callable:
    """``fn`` compiled whole (``fullgraph``: a graph break is an error): a graph per kept state (its buffers are
    guarded on). ``fn`` must not set attributes (a memo set on the first call is a guard failure, so a recompile, on
    the second).

    On a GPU with dynamic sizes, so one compilation of a whole step (minutes for a policy) serves every state and
    attention view. On a CPU with static sizes, every state its own compilation (inductor's C++ kernels vectorize
    only over static sizes and strides: with the batch symbolic, the grouped attention's inputs were gathered element
    by element), except the integer arguments named in ``dynamic_ints`` (the attention views, which grow during a
    request: one compilation serves them all; ``symbolic_views`` sets this once for a whole request), in a recompile
    region of its own (dynamo's automatic dynamic sizes, kept per function, would otherwise turn one engine's sizes
    symbolic after another engine's differed) and with inductor's C++ wrapper (the Python one cost about as much as
    the kernels of a tiny policy's step). A torch before 2.12 has no recompile regions: there dynamo's process-wide
    limit is raised to the same count per call.

    In its own recompile region on a CPU the function's graphs are not guarded on the modules they read (the
    policy's and the draft's ``nn.Module`` attributes, parameters and hooks: about 2,500 checks before each call of
    a fused step, a fifth of a cpu-tiny plain step): the engine owns those modules, updates their weights in place
    (same tensors, read afresh at every call) and builds a new engine, so a new compilation, for any other change.
    The guards on the function's own arguments (every state's tensors, the settings) stay."""
    cuda = torch.device(device).type == "cuda"
    native = "recompile_limit" in _COMPILE_ARGS         # torch.compile's own recompile region since torch 2.12
    options = {"cpp_wrapper": True} if backend == "inductor" and not cuda else {}
    if native and not cuda:
        options["guard_filter_fn"] = torch.compiler.skip_guard_on_all_nn_modules_unsafe
    regions = {"recompile_limit": WHOLE_RECOMPILE_LIMIT, "isolate_recompiles": not cuda} if native else {}
    compiled = torch.compile(fn, backend=backend, dynamic=cuda, fullgraph=True, options=options or None, **regions)
    dynamic = not cuda and bool(dynamic_ints)
    if native and not dynamic:
        return compiled
    sources = _sources(dynamic_ints)

    def call(*args, **settings):
        with contextlib.ExitStack() as scope:
            if not native:     # an older torch: dynamo's process-wide limit (8 graphs per function) raised for the call
                scope.enter_context(torch._dynamo.config.patch(recompile_limit=WHOLE_RECOMPILE_LIMIT))
            if dynamic and torch.compiler.config.dynamic_sources != sources:    # not inside symbolic_views
                scope.enter_context(torch.compiler.config.patch(dynamic_sources=sources))
            return compiled(*args, **settings)
    return call


class Cursor:
    """The next free column, on the host (for the overflow check) and on the device (for graphs)."""

    def __init__(self, max_slots: int, device):
        self.max_slots = max_slots
        self.host = 0
        self.dev = torch.zeros((), dtype=torch.long, device=device)

    def set(self, col: int, width: int) -> torch.Tensor:
        """Point the device cursor at ``col`` for a write of ``width`` columns; returns the device cursor."""
        if col + width > self.max_slots:
            raise RuntimeError(f"draft cache overflow: a write of {width} slots at column {col} passes "
                               f"max_slots={self.max_slots} (the request was sized wrongly)")
        self.host = col
        self.dev.fill_(col)
        return self.dev


def _slot_positions(positions: torch.Tensor, live: torch.Tensor | None) -> torch.Tensor:
    """``positions`` as the slot table stores them: long, -1 where ``live`` is False."""
    pos = positions if positions.dtype == torch.long else positions.to(torch.long)
    return pos if live is None else torch.where(live, pos, torch.full_like(pos, -1))


class StaticSlots:
    def __init__(self, batch: int, max_slots: int, device):
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if max_slots < 1:
            raise ValueError(f"max_slots must be >= 1, got {max_slots}")
        self.pos = torch.full((batch, max_slots), -1, dtype=torch.long, device=device)
        self.view = max_slots         # columns attention reads (set per call by the graphed caller)

    @property
    def max_slots(self) -> int:
        return self.pos.shape[1]

    def clear(self) -> None:
        self.pos.fill_(-1)

    def write(self, cursor: torch.Tensor, positions: torch.Tensor, live: torch.Tensor | None = None
              ) -> torch.Tensor:
        """Slots ``cursor + j`` (j < q) take ``positions [B, q]`` (-1 where ``live`` is False); returns the columns."""
        cols = cursor + torch.arange(positions.shape[1], device=self.pos.device)
        self.pos.index_copy_(1, cols, _slot_positions(positions, live))
        return cols

    def write_rows(self, cols: torch.Tensor, positions: torch.Tensor, live: torch.Tensor | None = None
                   ) -> torch.Tensor:
        """Row b's slots ``cols[b, j]`` take ``positions[b, j]`` (-1 where ``live`` is False); returns ``cols``."""
        self.pos.scatter_(1, cols, _slot_positions(positions, live))
        return cols

    def visible(self, q_pos: torch.Tensor) -> torch.Tensor:
        """Bool ``[B, q, view]``: the first ``view`` slots' visibility to queries at ``q_pos [B, q]``."""
        return slot_visible(self.pos[:, :self.view], q_pos)


class StaticKV:
    def __init__(self, batch: int, kv_heads: int, max_slots: int, head_dim: int, dtype, device):
        self.k = torch.zeros(batch, kv_heads, max_slots, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def write(self, cols: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keys/values ``[B, q, G, D]`` into slots ``cols [q]``."""
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if k.dtype != self.k.dtype:
            k, v = k.to(self.k.dtype), v.to(self.v.dtype)
        self.k.index_copy_(2, cols, k)
        self.v.index_copy_(2, cols, v)

    def view(self, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the first ``columns`` slots."""
        return self.k[:, :, :columns], self.v[:, :, :columns]


class StaticBatch:
    """A proposer's full-width input buffers while the engine's batch shrinks.

    Finished rows stay in the static buffers (computed on, never read) so that every graph keeps its
    batch size: ``rows`` maps the engine's active rows to buffer rows. Chosen over a graph per batch
    size because it is one capture per request shape and no row moves between buffers; the wasted
    draft work on finished rows is free on a host-bound step. The buffers are long-lived (a
    graph reads them by address) and reallocated only when a shape or dtype changes."""

    def __init__(self, batch: int, device):
        self.size, self.device = batch, device
        self.rows = torch.arange(batch, device=device)
        self._bufs: dict[str, torch.Tensor] = {}

    def restart(self) -> None:
        self.rows = torch.arange(self.size, device=self.device)

    def select(self, keep: torch.Tensor) -> None:
        self.rows = self.rows[keep.to(self.rows.device)]

    @property
    def full(self) -> bool:
        return self.rows.numel() == self.size

    def buffer(self, name: str, shape: tuple[int, ...], dtype) -> torch.Tensor:
        b = self._bufs.get(name)
        if b is None or tuple(b.shape) != tuple(shape) or b.dtype != dtype:
            b = self._bufs[name] = torch.zeros(shape, dtype=dtype, device=self.device)
        return b

    def stage(self, name: str, x: torch.Tensor, fill=None) -> torch.Tensor:
        """``x [active, ...]`` into buffer ``name [B, ...]`` at the active rows (the rest ``fill``, or stale)."""
        if x.shape[0] != self.rows.numel():
            raise ValueError(f"{name} has {x.shape[0]} rows, the batch has {self.rows.numel()} active rows")
        buf = self.buffer(name, (self.size, *x.shape[1:]), x.dtype)
        if self.full:
            buf.copy_(x)
        else:
            if fill is not None:
                buf.fill_(fill)
            buf.index_copy_(0, self.rows, x)
        return buf

    def take(self, out: torch.Tensor | None) -> torch.Tensor | None:
        """The active rows of a full-batch output."""
        return out if out is None or self.full else out.index_select(0, self.rows)


class StateCache:
    """A proposer's static states (buffers and the graphs captured over them) for its last few request shapes.

    A graph replays only over the tensors it was captured on, so when an engine alternates shapes (the
    training batch, the validation batch) each shape keeps its own buffers and graphs instead of
    reallocating and recapturing on every switch."""

    def __init__(self, size: int = 4):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size
        self._states: OrderedDict[Hashable, dict] = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], dict]) -> tuple[dict, bool]:
        """The state of ``key`` (built on a miss, evicting the least recently used), and whether it is new."""
        st = self._states.get(key)
        if st is not None:
            self._states.move_to_end(key)
            return st, False
        st = self._states[key] = build()
        while len(self._states) > self.size:
            self._states.popitem(last=False)
        return st, True

    def get_covering(self, key: tuple, build: Callable[[], dict], *, size_at: int) -> tuple[dict, bool]:
        """``get`` for keys with a size (columns a row) at ``key[size_at]``: the smallest kept state whose key is
        ``key`` but for a size at least ``key``'s serves the request; else ``key``'s state is built, and the kept
        states whose key is ``key`` but for a smaller size are dropped (every request they would serve fits the
        new one), so requests of growing sizes keep one state, not one per size met."""
        def same_but_size(k) -> bool:
            return len(k) == len(key) and all(a == b for i, (a, b) in enumerate(zip(k, key)) if i != size_at)

        need = key[size_at]
        covering = [k for k in self._states if same_but_size(k) and k[size_at] >= need]
        if covering:
            return self.get(min(covering, key=lambda k: k[size_at]), build)
        st, new = self.get(key, build)
        smaller = [k for k in self._states if same_but_size(k) and k[size_at] < need]
        for k in smaller:
            del self._states[k]
        if smaller:
            gc.collect()     # a state's graphed calls close over the state: a cycle, freed (buffers, pools) here
        return st, new

    def keys(self) -> list[Hashable]:
        """The kept states' keys, least recently used first."""
        return list(self._states)


class StaticProposerState:
    """What the graphed proposers share (a mixin): per request shape, the slot table, the batch map, the
    cursor and the two graphed calls (``_propose_static``, ``_observe_static``), kept in ``self._states``
    (a ``StateCache``) and made current by ``prepare_static``; the family adds its own caches (``extra``).
    The proposer keeps its draft in ``self.draft`` and calls ``init_static_state()`` in its ``__init__``. For the
    engine's fused step the family also gives ``_round_static`` (its observe then its propose, traced inside the
    step), ``_noise(batch, generator)`` (a propose's uniform draws) and ``_propose_settings(greedy, temperature)``."""

    needs_taps = True
    compact_min_waste = 64        # growing caches: squeeze dead slots out once this many columns would go
    check_steps = True            # host-side consistency checks per step (a device sync); the static engine skips them
    compile_static: str | None = None   # a backend: the two static calls compiled whole (whole-draft modes)
    graph_prompt_observe = False  # the request's first observe graphed too (few prompt widths: bucketed prompts)

    def init_static_state(self) -> None:
        self.static = False
        self._states = StateCache()
        self._graphs: dict[str, GraphedCallable] = {}

    def keep_states(self, n: int) -> None:
        """Keep the static states (buffers and graphs) of the last ``n`` request shapes (default 4)."""
        if n < 1:
            raise ValueError(f"keep_states needs n >= 1, got {n}")
        self._states.size = n

    @property
    def tap_spec(self):
        return self.draft.tap_spec

    def prepare_static(self, batch: int, max_slots: int, dtype, device, *, cuda_graphs: bool, name: str,
                       extra: Callable[[], dict]) -> None:
        fused = self.compile_static
        st, new = self._states.get_covering((batch, max_slots, dtype, str(device), fused), size_at=1, build=lambda: {
            "slots": StaticSlots(batch, max_slots, device), "sb": StaticBatch(batch, device),
            "cursor": Cursor(max_slots, device),
            # one graph per attention view (observe: and per prompt width), each call's graphs in one memory pool:
            # a state holds each call's largest graph's activations, not their sum (per-graph pools of a warm-up
            # meeting every view held tens of GB). Safe: a propose's proposals are read by the verify step and its
            # accept before the next propose, and an observe has no outputs
            "_graphs": {part: GraphedCallable(self._static_call(part, fused, device), f"{name}.{part}",
                                              persistent_inputs=True, shared_pool=True)
                        for part in ("propose", "observe")},
            **extra()})
        self.__dict__.update(st)
        if not new:
            self.slots.clear()
            self.sb.restart()
        for g in self._graphs.values():
            g.enabled = cuda_graphs
        self.next_col = 0
        self.static = True

    def _static_call(self, part: str, backend: str | None, device) -> Callable:
        fn = getattr(self, f"_{part}_static")
        return traced_whole(fn, backend, device=device, dynamic_ints=VIEW_ARGS) if backend else fn

    def observe_static(self, width: int, inputs: list[tuple[str, torch.Tensor, object]]) -> None:
        """One ``observe`` on the static caches: ``inputs`` are ``(buffer name, tensor, fill)`` in the order of
        ``_observe_static``'s arguments (then the cursor). The per-verify-step ones (width k+1) replay the graph.
        The prefill (the request's first observe, as wide as the prompt) runs eagerly, or, with
        ``graph_prompt_observe`` (set by an engine that pads prompts to a bucket and runs these calls uncompiled),
        replays a graph per width."""
        cursor = self.cursor.set(self.next_col, width)
        view = self.view_after(width)
        if self.next_col == 0:       # rows idle from the start (a bucketed batch) take the fills, as later
            args = ([x for _, x, _ in inputs] if self.sb.full
                    else [self.sb.stage(f"prefill.{name}", x, fill=fill) for name, x, fill in inputs])
            observe = self._graphs["observe"] if self.graph_prompt_observe else self._observe_static
            observe(*args, cursor, view=view)
        else:
            self._graphs["observe"](*(self.sb.stage(name, x, fill=fill) for name, x, fill in inputs), cursor,
                                    view=view)
        self.next_col += width

    # -- one observe and the next propose inside the engine's step (cuda_graphs="fused") -------------------------
    propose_width = 0             # columns a static propose writes past the observed ones (EAGLE-3: its chain keys)

    def begin_round(self, width: int, *, batch: int, greedy: bool, temperature: float, generator
                    ) -> tuple[torch.Tensor, tuple[int, int], tuple[tuple[str, object], ...], tuple[torch.Tensor, ...]]:
        """The host's part of one ``_round_static``: an observe writing ``width`` columns at the cursor, then a propose.
        Checks the cache (on the host) and points the device cursor; returns it, the two calls' views, the propose's
        settings as sorted items (hashable: they key the compiled and captured step) and its uniform draws (none when
        greedy), drawn from ``generator`` as ``propose`` draws them."""
        if not self.sb.full:
            raise RuntimeError("a proposer's round runs in the engine's step only on its full static batch")
        cursor = self.cursor.set(self.next_col, width + self.propose_width)
        observe_view = self.view_after(width)
        self.next_col += width
        settings = tuple(sorted(self._propose_settings(greedy, temperature).items()))
        noise = () if greedy else (self._noise(batch, generator),)
        return cursor, (observe_view, self.view_after(self.propose_width)), settings, noise

    def view_after(self, width: int) -> int:
        """The attention view of a call that writes ``width`` columns at the cursor."""
        return view_columns(self.next_col + width, self.slots.max_slots)

    def graph_status(self) -> dict:
        """Per graphed call: captures, replays, eager calls, and why capture failed (if it did)."""
        return {name: g.status() for name, g in self._graphs.items()}
