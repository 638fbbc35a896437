"""KV-cache bookkeeping for ragged speculative decoding: slot positions, masks, trimming, row selection.

A batched cache stores keys/values in *slots* ``[B, heads, S, d]``. Speculative decoding appends k+1
slots per row per verify step, but each row keeps only the slots of its accepted tokens. Instead of
moving memory, ``SlotTable`` remembers each slot's token position (``-1`` = not a live token: left
padding of a short prompt, or a rejected draft token) and turns that into the attention mask of the
next forward: a query at position ``p`` sees exactly the live slots at positions ``<= p`` (and
``> p - window`` for sliding-window layers). Because RoPE is applied at the true positions, a cache
with holes computes exactly what a dense cache of the live tokens would.

The table is shared by the policy's HF ``DynamicCache`` and the drafts' own caches, so the inference
masks live here, in one place (the drafts' *training* masks live in ``kernels.attention``).

    table = SlotTable(batch=2, device="cpu")
    table.append(pos, live)                  # [B, q] positions and liveness of the slots being added
    mask = table.additive_mask(pos, torch.float32)   # [B, 1, q, S] for the forward that adds them
"""
from __future__ import annotations

import torch


class SlotTable:
    """Token position per cache slot and row (``-1``: dead slot)."""

    def __init__(self, batch: int, device: torch.device | str):
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.pos = torch.empty(batch, 0, dtype=torch.long, device=device)

    @property
    def batch(self) -> int:
        return self.pos.shape[0]

    @property
    def length(self) -> int:
        return self.pos.shape[1]

    def append(self, positions: torch.Tensor, live: torch.Tensor | None = None) -> None:
        """Add ``q`` slots per row at ``positions [B, q]``; ``live [B, q]`` False marks them dead at once."""
        if positions.dim() != 2 or positions.shape[0] != self.batch:
            raise ValueError(f"positions must be [batch={self.batch}, q], got {tuple(positions.shape)}")
        pos = positions.to(self.pos.device, torch.long)
        if live is not None:
            pos = torch.where(live.to(pos.device), pos, torch.full_like(pos, -1))
        self.pos = torch.cat([self.pos, pos], dim=1)

    def kill(self, start: int, keep: torch.Tensor) -> None:
        """Mark slots ``start + j`` dead for ``j >= keep[b]`` (per row), e.g. rejected draft tokens."""
        q = self.length - start
        if q < 0:
            raise ValueError(f"kill start {start} beyond the table length {self.length}")
        j = torch.arange(q, device=self.pos.device).unsqueeze(0)
        dead = j >= keep.to(self.pos.device).view(-1, 1)
        tail = self.pos[:, start:]
        self.pos = torch.cat([self.pos[:, :start], tail.masked_fill(dead, -1)], dim=1)

    def dead_tail(self) -> int:
        """Number of trailing slots that are dead in every row (they can be cut from the cache)."""
        live_cols = (self.pos >= 0).any(dim=0).nonzero()
        last = int(live_cols.max()) + 1 if live_cols.numel() else 0
        return self.length - last

    def trim(self, length: int) -> None:
        self.pos = self.pos[:, :length]

    def compact(self, min_waste: int = 64) -> torch.Tensor | None:
        """Squeeze out dead slots when at least ``max(min_waste, length // 4)`` columns would go.

        Returns the gather order ``[B, L]`` (each row's live slots first, in their original order; L the
        largest live count) that the caller applies to its caches, or None when not worth it. Masks
        depend on positions only, so moving slots changes no attention result.
        """
        live = self.pos >= 0
        L = int(live.sum(1).max()) if self.length else 0
        if self.length - L < max(min_waste, self.length // 4, 1):
            return None
        order = torch.argsort((~live).to(torch.int8), dim=1, stable=True)[:, :L]
        self.pos = self.pos.gather(1, order)
        return order

    def select(self, rows: torch.Tensor) -> None:
        self.pos = self.pos[rows]

    def visible(self, q_pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
        """Bool ``[B, q, S]``: slot visible to the query at ``q_pos [B, q]`` (live, causal, in window)."""
        return slot_visible(self.pos, q_pos, window)

    def additive_mask(self, q_pos: torch.Tensor, dtype: torch.dtype, window: int | None = None) -> torch.Tensor:
        """``[B, 1, q, S]`` additive mask (0 visible, dtype-min hidden) for HF eager and SDPA attention."""
        vis = self.visible(q_pos, window)
        mask = torch.zeros(vis.shape, dtype=dtype, device=vis.device)
        mask.masked_fill_(~vis, torch.finfo(dtype).min)
        return mask.unsqueeze(1)


def slot_visible(slot_pos: torch.Tensor, q_pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Bool ``[B, q, S]``: slot (position ``slot_pos [B, S]``, -1 dead) visible to the query at ``q_pos [B, q]``."""
    kv = slot_pos.unsqueeze(1)
    qp = (q_pos if q_pos.device == slot_pos.device else q_pos.to(slot_pos.device)).unsqueeze(2)
    vis = (kv >= 0) & (kv <= qp)
    if window is not None:
        vis &= kv > qp - window
    return vis


def hf_cache_layers(cache) -> list:
    """The per-layer key/value holders of an HF ``DynamicCache`` (transformers >= 5)."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"expected a transformers>=5 DynamicCache with .layers, got {type(cache).__name__}")
    return layers


def trim_hf_cache(cache, length: int) -> None:
    """Keep the first ``length`` slots of every layer of an HF ``DynamicCache``."""
    for layer in hf_cache_layers(cache):
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys[:, :, :length]
            layer.values = layer.values[:, :, :length]


def gather_slots(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``x [B, heads, S, d]`` at slots ``order [B, L]`` -> ``[B, heads, L, d]``."""
    idx = order[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3])
    return x.gather(2, idx)


def gather_hf_cache(cache, order: torch.Tensor) -> None:
    """Apply a ``SlotTable.compact`` order to every layer of an HF ``DynamicCache``."""
    for layer in hf_cache_layers(cache):
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = gather_slots(layer.keys, order)
            layer.values = gather_slots(layer.values, order)


def select_hf_cache_rows(cache, rows: torch.Tensor) -> None:
    """Keep only batch ``rows`` of every layer of an HF ``DynamicCache``."""
    for layer in hf_cache_layers(cache):
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys[rows]
            layer.values = layer.values[rows]
