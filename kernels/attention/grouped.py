"""Grouped-query attention for decode and verify steps without copying keys/values per query head.

SDPA with a mask and fewer key/value heads than query heads has two routes on a GPU: repeat the keys and values to
every query head (transformers' ``repeat_kv``: a copy of the whole cache view per layer and step, which at batch 64
over a few hundred slots costs more than the layer's matmuls), or ``enable_gqa``, which no masked fused kernel
takes (SDPA falls back to its math kernel). Here the ``r = H / G`` query heads of each group are folded into the
query length instead, ``[B, H, q, D] -> [B, G, r*q, D]``, and the mask is repeated along that length (``r*q*S``
entries per row, not ``r*S*D``), so one masked fused kernel reads every key and value once. Exact: the same
softmax over the same keys per query.

    out = grouped_sdpa(q, k, v, mask)      # q [B, H, q, D], k/v [B, G, S, D], mask [B, 1, q, S]: out [B, H, q, D]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def grouped_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                 scale: float | None = None) -> torch.Tensor:
    """Masked SDPA of ``q [B, H, Q, D]`` over ``k/v [B, G, S, D]`` (query head ``h`` reads key/value head
    ``h // (H / G)``, transformers' layout) with a bool or additive ``mask [B, 1, Q, S]``; out ``[B, H, Q, Dv]``."""
    B, H, Q, D = q.shape
    G, S = k.shape[1], k.shape[2]
    if H % G:
        raise ValueError(f"query heads {H} must be a multiple of key/value heads {G}")
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != Q or mask.shape[3] != S:
        raise ValueError(f"mask must be [B, 1, {Q}, {S}] (one mask for every head), got {tuple(mask.shape)}")
    r = H // G
    if r == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    qf = q.reshape(B, G, r * Q, D)
    mf = mask.expand(mask.shape[0], r, Q, S).reshape(mask.shape[0], 1, r * Q, S)
    out = F.scaled_dot_product_attention(qf, k, v, attn_mask=mf, scale=scale)
    return out.reshape(B, H, Q, v.shape[-1])
