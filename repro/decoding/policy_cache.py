"""The policy's static KV cache: fixed slots per row, per-row lengths and liveness, behind transformers' Cache API
(layout and visibility rule: docs/engine.md).

    cache = StaticPolicyCache(2, 256, num_layers=8, kv_heads=2, head_dim=16, dtype=torch.float32, device="cpu")
    cache.start()                                     # a new request: every slot dead, cursor at column 0
    cols = cache.begin(positions, live)               # the forward of positions [B, q] writes these columns
    cols = cache.begin(positions, row_cols=pad[:, None] + positions)   # or each row its own (a verify step's)
    cache.compact()                                   # live slots to the front of each row (reserve does it when full)
    masks = cache.additive_masks(positions, {"full_attention": None})

Engines whose requests never overlap (a lockstep's rows, one after another in one process) may share one pair of
key/value buffers: ``SharedKVStorage``, passed as ``storage=``; each cache's tensors then live on its memory (see its
docstring).
"""
from __future__ import annotations

import math

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kernels.attention.grouped import write_columns
from repro.decoding.kv import slot_visible
from repro.decoding.static_kv import Cursor, StaticSlots, view_columns


class SlotLayer(CacheLayerMixin):
    """One decoder layer's static keys/values; writes go to the owning cache's current columns."""

    is_compileable = True
    is_sliding = False

    def __init__(self, owner: StaticPolicyCache, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.owner, self.keys, self.values = owner, keys, values
        self.is_initialized = True
        self.device = keys.device

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("a SlotLayer is allocated up front (StaticPolicyCache); it never initialises lazily")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        raise RuntimeError("a SlotLayer is written through its SlotCache (update with the layer index)")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.view, 0

    def get_seq_length(self) -> int:
        # the model only asks when it is given no position ids (the policy always passes them)
        raise RuntimeError("a StaticPolicyCache has no single sequence length: pass position_ids")

    def get_max_length(self) -> int:
        return self.keys.shape[2]

    def reset(self) -> None:
        self.keys.zero_()
        self.values.zero_()


class SlotCache(Cache):
    """The HF ``Cache`` over a ``StaticPolicyCache``: ``update`` writes into the stacked keys/values at the layer
    index (a tensor ``select``, so under ``torch.compile`` the index may stay symbolic)."""

    def __init__(self, owner: StaticPolicyCache, layers: list[SlotLayer]):
        super().__init__(layers=layers)
        self.owner = owner

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        if self.owner.write_on_attend:      # the attention writes them (repro.models.policy_attention)
            return key_states, value_states
        return self.owner.write(layer_idx, key_states, value_states)


class SharedKVStorage:
    """The key and value buffers of static policy caches that take turns: each cache built with ``storage=`` gets
    tensors on one flat buffer per role (keys, values), dtype and device, grown to the largest cache asked for.

    Why it is safe: a request (``RolloutEngine.generate`` on the static path) begins with every slot of its cache
    dead (``start``), writes before it reads, and masks every column it did not write (the mask follows each slot's
    position), so what another cache left in the shared columns is never seen, as a cache's own earlier requests are
    not; and it finishes (one host sync for its results) before the next request starts. So the caches may belong
    to different engines, even different policies of the same shapes, as long as no two requests run at once: the
    lockstep's rows, one after another in one process, hold one buffer instead of one per row. A cache built before
    the buffer grew keeps the old one (its captured graphs point there)."""

    def __init__(self):
        self._flat: dict[tuple[str, torch.dtype, str], torch.Tensor] = {}

    def take(self, role: str, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
        """A contiguous ``shape`` tensor on the shared ``role`` buffer's memory (allocated, or reallocated larger, as
        needed). Not a view (no ``_base``): to autograd and the compilers it is an ordinary tensor, as the
        cache's own would be; it shares the buffer's storage."""
        n = math.prod(shape)
        key = (role, dtype, str(torch.device(device)))
        flat = self._flat.get(key)
        if flat is None or flat.numel() < n:
            flat = self._flat[key] = torch.zeros(n, dtype=dtype, device=device)
        return torch.empty(0, dtype=dtype, device=flat.device).set_(flat.untyped_storage(), 0, shape)

    def nbytes(self) -> int:
        """Bytes of the buffers held now (not counting older, smaller ones that caches still hold)."""
        return sum(t.numel() * t.element_size() for t in self._flat.values())


class StaticPolicyCache:
    def __init__(self, batch: int, max_slots: int, *, num_layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device, value_head_dim: int | None = None,
                 storage: SharedKVStorage | None = None):
        for name, v in (("batch", batch), ("max_slots", max_slots), ("num_layers", num_layers),
                        ("kv_heads", kv_heads), ("head_dim", head_dim)):
            if int(v) < 1:
                raise ValueError(f"StaticPolicyCache needs {name} >= 1, got {v}")
        self.batch, self.max_slots, self.num_layers, self.dtype = batch, max_slots, num_layers, dtype
        self.device = torch.device(device)
        self.slots = StaticSlots(batch, max_slots, self.device)
        self.cursor = Cursor(max_slots, self.device)
        vd = value_head_dim or head_dim
        shapes = {"keys": (batch, kv_heads, num_layers * max_slots, head_dim),
                  "values": (batch, kv_heads, num_layers * max_slots, vd)}
        for role, shape in shapes.items():
            setattr(self, role, storage.take(role, shape, dtype, self.device) if storage is not None
                    else torch.zeros(shape, dtype=dtype, device=self.device))
        self.hf = SlotCache(self, [SlotLayer(self, *self.layer(i, max_slots)) for i in range(num_layers)])
        self.cols: torch.Tensor | None = None     # the columns the running forward writes: [q], or [B, q] per row
        self.layer_offsets = torch.arange(num_layers, device=self.device) * max_slots
        self.layer_cols: torch.Tensor | None = None   # [layers, q] or [layers, B, q]: where each layer's keys go
        self.view = max_slots                     # the columns the running forward's attention reads
        self.next_col = 0                         # host copy of the cursor: the next free column
        self.compactions = 0                      # ``compact`` calls so far
        self.in_graph = False                     # whole forwards are traced (the write and attention inline)
        # set for a forward whose attention function takes this cache (``slot_cache=``) and writes each layer's
        # keys/values itself, in the attention kernel's launch where it can: ``update`` then hands them through
        self.write_on_attend = False

    def write(self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor):
        """``key/value_states [B, G, q, D]`` of decoder layer ``layer`` into the columns of the running forward;
        returns that layer's keys and values over the attention view."""
        return (self._write if self.in_graph else self._write_eager)(layer, key_states, value_states)

    def _write(self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor):
        cols = self.cols
        if cols is None or cols.shape[-1] != key_states.shape[2]:
            raise RuntimeError(f"the static policy cache was not begun for this forward: {key_states.shape[2]} new "
                               f"tokens, columns {None if cols is None else cols.shape[-1]} (call begin() first)")
        at = self.layer_cols[layer]
        write_columns(self.keys, at, key_states)
        write_columns(self.values, at, value_states)
        return self.layer(layer, self.view)

    # a graph break inside a compiled decoder layer (repro.rollout.compiled_layers, whose layer index is symbolic)
    _write_eager = torch.compiler.disable(_write)

    def layer(self, layer: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder layer ``layer``'s keys and values ``[B, G, columns, D]`` (views)."""
        at = layer * self.max_slots
        return self.keys[:, :, at:at + columns], self.values[:, :, at:at + columns]

    def start(self) -> None:
        """A new request: every slot dead and the cursor at column 0 (stale keys/values stay, masked)."""
        self.slots.clear()
        self.next_col = 0

    def reserve(self, width: int) -> torch.Tensor:
        """Point the device cursor at the next ``width`` free columns (host-side check, no device sync); when they
        would pass the cache's end, ``compact`` first."""
        if self.next_col + width > self.max_slots:
            self.compact()
        cur = self.cursor.set(self.next_col, width)
        self.next_col += width
        return cur

    def begin(self, positions: torch.Tensor, live: torch.Tensor | None = None,
              cursor: torch.Tensor | None = None, view: int | None = None, *,
              row_cols: torch.Tensor | None = None) -> torch.Tensor:
        """Record the slot positions of a forward of ``positions [B, q]`` at the cursor's columns (``live`` False:
        dead at once) and make those columns the ones every layer's ``update`` writes; attention reads the first
        ``view`` columns. With no ``cursor`` the next ``q`` columns are reserved here (and ``view`` follows from
        them); a graphed caller passes the device cursor and the view it reserved itself.

        ``row_cols [B, q]`` instead: each row writes its own columns, its frontier (a verify step's, where a row's
        token at position p lives in column p + its left padding: the rows' lengths differ, and each step's columns
        overwrite the proposals the last step rejected). Every column past a row's frontier is then invisible to
        it (older columns of that row hold higher positions, or none), so ``frontier`` tells the attention it may
        stop reading there; the caller passes ``view``, covering every row's frontier."""
        if positions.dim() != 2 or positions.shape[0] != self.batch:
            raise ValueError(f"positions must be [batch={self.batch}, q], got {tuple(positions.shape)}")
        if row_cols is not None:
            if row_cols.shape != positions.shape or view is None:
                raise ValueError(f"row_cols must be [batch, q] = {tuple(positions.shape)} and come with a view, got "
                                 f"{tuple(row_cols.shape)} and view={view}")
            self.view = int(view)
            self.cols = self.slots.write_rows(row_cols, positions, live)
            self.layer_cols = self.cols[None] + self.layer_offsets[:, None, None]     # [layers, B, q]
            return self.cols
        if cursor is None:
            cursor = self.reserve(positions.shape[1])
            view = self.used_view()
        self.view = self.max_slots if view is None else int(view)
        self.cols = self.slots.write(cursor, positions, live)
        # every layer's columns at once (one kernel a forward, not one a layer): layer l writes cols + l * max_slots
        self.layer_cols = self.cols + self.layer_offsets[:, None]
        return self.cols

    @property
    def frontier(self) -> bool:
        """Whether the running forward writes each row's frontier (``begin(row_cols=)``: per-row columns)."""
        return self.cols is not None and self.cols.dim() == 2

    def compact(self) -> int:
        """Move every row's live slots (their positions, keys and values, in order) to its first columns and the
        cursor to the longest row's live count; returns that count. Dead columns (rejected proposals, left pads)
        are freed, so a cache sized for the prompt, the answer and a few verify steps serves a whole request.
        Attention is unchanged: the mask follows each slot's position, not its column. Eager device work, one
        layer at a time (a layer's keys as scratch), and one host sync for the new cursor; never inside a graph."""
        pos = self.slots.pos
        order = torch.sort((pos < 0).to(torch.uint8), dim=1, stable=True).indices     # live columns first
        live = int((pos >= 0).sum(1).max())
        pos.copy_(pos.gather(1, order))
        for store in (self.keys, self.values):
            index = order[:, None, :, None].expand(-1, store.shape[1], -1, store.shape[3])
            for layer in range(self.num_layers):
                cols = store[:, :, layer * self.max_slots:(layer + 1) * self.max_slots]
                cols.copy_(cols.gather(2, index))
        self.next_col = live
        self.compactions += 1
        return live

    def used_view(self) -> int:
        """The attention view covering every column reserved so far."""
        return view_columns(self.next_col, self.max_slots)

    def grow_view(self, width: int) -> int:
        """For a forward writing each row's frontier (``begin(row_cols=)``), ``width`` columns at most past the last
        one's: the view that covers every row's (the host's bound; never compacts: the frontiers stay within a
        cache of the prompt, the answer and one step's columns)."""
        self.next_col = min(self.next_col + width, self.max_slots)
        return self.used_view()

    def kill(self, cols: torch.Tensor, keep: torch.Tensor) -> None:
        """Slots ``cols[j]`` die for ``j >= keep[b]`` (per row): rejected proposals. Device ops only."""
        j = torch.arange(cols.numel(), device=self.device)
        cur = self.slots.pos.index_select(1, cols)
        self.slots.pos.index_copy_(1, cols, torch.where(j[None, :] < keep[:, None], cur, torch.full_like(cur, -1)))

    def additive_masks(self, q_pos: torch.Tensor, windows: dict[str, int | None]) -> dict[str, torch.Tensor]:
        """Per layer type, the ``[B, 1, q, view]`` additive mask (0 visible, dtype-min hidden) of queries at
        ``q_pos [B, q]``; ``windows`` maps each layer type to its sliding window (None: full attention)."""
        out = {}
        slot_pos = self.slots.pos[:, :self.view]
        for kind, window in windows.items():
            vis = slot_visible(slot_pos, q_pos, window)
            mask = torch.zeros(vis.shape, dtype=self.dtype, device=self.device)
            mask.masked_fill_(~vis, torch.finfo(self.dtype).min)
            out[kind] = mask.unsqueeze(1)
        return out

