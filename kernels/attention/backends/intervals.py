"""Per-query key intervals and the tile tables block-sparse kernels skip work with.

Every MaskSpec kind is "query row t sees the keys [lo[t], hi[t])" (absolute key rows; causal: [segment start,
own position], full: the segment, prefix: [segment start, key_end[t])). Kernels that take a mask function
plus block-sparsity tables (flex_attention, flash-attn-4) get the intervals as the mask's data and the
tables from ``tile_tables``: which (query tile, key tile) pairs some row sees partly ("partial": the mask
is evaluated there) or every row sees entirely ("full": no mask needed); other tiles are skipped. The
tables are built from the intervals directly, never from a dense [Tq, Tk] mask, so they cost
O(Tq/bq * Tk/bk) even at 256K tokens.

    lo, hi = intervals(spec, device)
    t = tile_tables([(lo, hi)], Tq, Tk, block_q=128, block_k=128)
    cnt, idx = ordered(t.partial)              # per query tile: how many, and which key tiles (first)
    cnt_t, idx_t = ordered(t.partial.T)        # per key tile (the backward's direction)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.attention.spec import MaskSpec
from kernels.attention.staging import to_device


def intervals(spec: MaskSpec, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query row the visible key rows [lo, hi) (int64 on ``device``; lo == hi: no key)."""
    lq = spec.cu_q.diff()
    seg = torch.repeat_interleave(torch.arange(lq.numel()), lq)
    k0, k1 = spec.cu_k[:-1][seg], spec.cu_k[1:][seg]
    if spec.kind == "full":
        lo, hi = k0, k1
    elif spec.kind == "causal":
        lo = k0
        hi = k0 + (torch.arange(spec.num_q) - spec.cu_q[:-1][seg]) + 1
    else:
        lo = k0
        hi = torch.minimum(torch.maximum(spec.key_end, k0), k1)
    return to_device(lo, device), to_device(hi, device)


@dataclass(frozen=True)
class TileTables:
    partial: torch.Tensor        # [nQ, nK] bool: some row sees part of the tile (evaluate the mask)
    full: torch.Tensor           # [nQ, nK] bool: every row of the tile sees every key of it


def tile_tables(pairs, Tq: int, Tk: int, block_q: int, block_k: int, exact=None) -> TileTables:
    """Tile tables of the union of per-row intervals ``pairs = [(lo, hi), ...]`` (each [Tq] int64).

    ``exact[i] = False`` marks interval i as one the mask narrows further (e.g. by key validity): its
    tiles are never "full". Rows past Tq (the last tile's padding) see nothing."""
    device = pairs[0][0].device
    nq, nk = -(-Tq // block_q), -(-Tk // block_k)
    exact = [True] * len(pairs) if exact is None else list(exact)
    touched = torch.zeros(nq, nk, dtype=torch.bool, device=device)
    full = torch.zeros(nq, nk, dtype=torch.bool, device=device)
    pad = nq * block_q - Tq
    rows = torch.arange(nq * block_q, device=device) // block_q
    c0 = torch.arange(nk, device=device) * block_k
    for (lo, hi), ex in zip(pairs, exact):
        lo_p = torch.cat([lo, lo.new_zeros(pad)])
        hi_p = torch.cat([hi, hi.new_zeros(pad)])
        nonempty = hi_p > lo_p
        first = torch.div(lo_p, block_k, rounding_mode="floor")
        last = torch.div(hi_p - 1, block_k, rounding_mode="floor")
        diff = torch.zeros(nq, nk + 1, dtype=torch.int32, device=device)
        one = torch.ones_like(first, dtype=torch.int32)
        diff.index_put_((rows[nonempty], first[nonempty]), one[nonempty], accumulate=True)
        diff.index_put_((rows[nonempty], last[nonempty] + 1), -one[nonempty], accumulate=True)
        touched |= diff.cumsum(1)[:, :nk] > 0
        if ex:
            full |= ((lo_p.view(nq, block_q).amax(1)[:, None] <= c0[None])
                     & (hi_p.view(nq, block_q).amin(1)[:, None] >= (c0 + block_k)[None])
                     & ((c0 + block_k) <= Tk)[None])
    return TileTables(touched & ~full, full)


def ordered(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, k] bool -> (count [n] int32, column indices [n, k] int32 with the True ones first, in order), both
    contiguous (kernels read them with a unit last stride). A scatter of each column to its rank, not a sort."""
    num = m.sum(-1, dtype=torch.int32).contiguous()
    rank = torch.where(m, m.cumsum(-1) - 1, num.unsqueeze(-1) + (~m).cumsum(-1) - 1)
    cols = torch.arange(m.shape[-1], dtype=torch.int32, device=m.device).expand(m.shape)
    return num, torch.empty(m.shape, dtype=torch.int32, device=m.device).scatter_(-1, rank, cols)
