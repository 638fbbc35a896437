"""DFlash / DSpark block attention over a right-padded batch in one masked SDPA call (one rank, no CP).

``block_draft_attention`` serves packed batches and context parallelism: it locates, sorts and plans
the blocks on the host, then runs the zigzag ring. An RL update's draft batch is neither packed nor
sharded: rows are right-padded to one length ``S`` and each row's blocks see only that row. For that
shape this route builds the mask on the device from the anchors (no host work, no host sync; capturable
in a CUDA graph) and calls ``torch.nn.functional.scaled_dot_product_attention`` once:

    q [R, N*B, H, D], k/v [R, N*B, G, D]   the row's N blocks of B slots (block n = slots n*B .. n*B+B-1)
    ctx_k/ctx_v [R, S, G, D]               the row's context keys/values
    anchors [R, N] int64                   position of block n's anchor in its row
    block_valid [R, N] bool                False: the block sees nothing (out 0), as block_draft_attention
    -> out [R, N*B, H, D]

A query of block n sees context keys ``j < anchors[n]`` of its row and every slot of its own block. The
cost is ``N*B x (S + N*B)`` scores per row and head (the ring route skips the keys past each anchor), so
this route is for the short rows of RL batches; the same mask as ``reference.block_mask`` per row.
``backend="flash4"`` runs the same attention as one flash-attn-4 masked call each way instead
(kernels/attention/fused_block.py: the mask from the anchors on the device, tiles past the anchors skipped
on sm90); SDPA ("sdpa", the default) takes the boolean mask.

    out = padded_block_attention(q, k, v, ctx_k, ctx_v, anchors, block_valid)
    out = padded_block_attention(q, k, v, ctx_k, ctx_v, anchors, block_valid, backend="flash4")
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def padded_block_mask(anchors: torch.Tensor, block_valid: torch.Tensor, block: int, seq_len: int) -> torch.Tensor:
    """``[R, N*B, S + N*B]`` bool: context keys before the query's anchor, then its own block's slots.
    Invalid blocks see their own block here (no all-masked row); ``padded_block_attention`` zeroes them."""
    R, N = anchors.shape
    dev = anchors.device
    ctx = torch.arange(seq_len, device=dev) < anchors[..., None]                 # [R, N, S]
    own = torch.eye(N, dtype=torch.bool, device=dev).repeat_interleave(block, dim=1)   # [N, N*B]
    m = torch.cat([ctx & block_valid[..., None], own.expand(R, N, N * block)], dim=-1)
    return m.repeat_interleave(block, dim=1)                                      # [R, N*B, S+N*B]


def padded_block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx_k: torch.Tensor,
                           ctx_v: torch.Tensor, anchors: torch.Tensor, block_valid: torch.Tensor | None = None,
                           *, scale: float | None = None, mask: torch.Tensor | None = None,
                           backend="sdpa") -> torch.Tensor:
    """Block attention of a right-padded batch; see the module docstring. ``mask`` (``padded_block_mask``)
    may be passed in when several layers attend over the same blocks (SDPA route). No value checks that
    would read device data: shapes only."""
    if not isinstance(q, torch.Tensor) or not q.is_floating_point():
        raise TypeError(f"q must be a floating-point tensor, got {getattr(q, 'dtype', type(q))}")
    if q.dim() != 4 or k.shape[:2] != q.shape[:2] or v.shape != k.shape:
        raise ValueError(f"q must be [R, N*B, H, D] and k/v [R, N*B, G, D] alike, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    R, Q, H, D = q.shape
    G = k.shape[2]
    if anchors.dim() != 2 or anchors.shape[0] != R or Q % anchors.shape[1]:
        raise ValueError(f"anchors must be [R={R}, N] with N dividing the {Q} block queries, got "
                         f"{tuple(anchors.shape)}")
    if ctx_k.dim() != 4 or ctx_k.shape[0] != R or ctx_k.shape[2:] != (G, D) or ctx_v.shape != ctx_k.shape:
        raise ValueError(f"ctx_k/ctx_v must be [R={R}, S, G={G}, D={D}], got {tuple(ctx_k.shape)} and "
                         f"{tuple(ctx_v.shape)}")
    if H % G:
        raise ValueError(f"query heads H={H} must be a multiple of key/value heads G={G}")
    N, S = anchors.shape[1], ctx_k.shape[1]
    valid = torch.ones_like(anchors, dtype=torch.bool) if block_valid is None else block_valid.bool()
    if backend != "sdpa":
        from kernels.attention.fused_block import fused_block_attention
        return fused_block_attention(q, k, v, ctx_k, ctx_v, torch.zeros_like(anchors), anchors, None, valid,
                                     scale=scale, backend=backend)
    if mask is None:
        mask = padded_block_mask(anchors, valid, Q // N, S)
    keys = torch.cat([ctx_k, k], dim=1).transpose(1, 2)                         # [R, G, S+Q, D]
    vals = torch.cat([ctx_v, v], dim=1).transpose(1, 2)
    if G != H:                       # repeat rather than enable_gqa: every SDPA kernel with a mask takes it
        keys, vals = keys.repeat_interleave(H // G, dim=1), vals.repeat_interleave(H // G, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=mask[:, None],
                                         scale=D ** -0.5 if scale is None else float(scale))
    out = out.transpose(1, 2)                                                    # [R, Q, H, D]
    if block_valid is None:
        return out
    keep = valid.repeat_interleave(Q // N, dim=1)[..., None, None]
    return torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device))
