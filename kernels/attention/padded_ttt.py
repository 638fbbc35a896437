"""EAGLE-3 TTT attention over a right-padded batch in one masked SDPA call per pass (one rank, no CP).

``eagle3_ttt_attention`` serves packed batches and context parallelism: the causal trunk on the zigzag ring plus
the branch kernels, merged by log-sum-exp, with host-side plans. An RL update's draft batch is neither packed nor
sharded: rows are right-padded to one length ``S``, and a row's positions see only that row. For that shape this
route concatenates the passes' keys and calls ``torch.nn.functional.scaled_dot_product_attention`` once with one
mask shared by every row and head (built on the device; no host work, no host sync: capturable in a CUDA graph):

    q [R, S, H, D]                          pass P's queries
    k_passes / v_passes: P + 1 of [R, S, G, D]   pass 0 (the trunk) first, then passes 1..P
    -> out [R, S, H, D]

Position i of pass P sees trunk keys j <= i of its row and the keys of passes 1..P at i itself, the mask of
``reference.eagle3_ttt_mask`` per row. Right padding is harmless: a real position never sees a later one. The cost
is ``S x (P + 1) S`` scores per row and head (the kernels route skips the causal upper half), so this route is for
the short rows of RL batches.

    out = padded_ttt_attention(q, [k0, k1], [v0, v1])
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def padded_ttt_mask(seq_len: int, passes: int, device=None) -> torch.Tensor:
    """``[S, (passes + 1) S]`` bool: causal over the trunk's keys, then the diagonal of each branch pass."""
    if seq_len < 1 or passes < 0:
        raise ValueError(f"seq_len must be >= 1 and passes >= 0, got seq_len={seq_len}, passes={passes}")
    i = torch.arange(seq_len, device=device)
    causal = i[None, :] <= i[:, None]
    return torch.cat([causal] + [i[None, :] == i[:, None]] * passes, dim=1)


def padded_ttt_attention(q: torch.Tensor, k_passes: Sequence[torch.Tensor], v_passes: Sequence[torch.Tensor], *,
                         scale: float | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """TTT attention of pass ``len(k_passes) - 1`` over a right-padded batch; see the module docstring. ``mask``
    (``padded_ttt_mask``) may be passed in; shapes are checked, device data is never read."""
    if not isinstance(q, torch.Tensor) or not q.is_floating_point():
        raise TypeError(f"q must be a floating-point tensor, got {getattr(q, 'dtype', type(q))}")
    if len(k_passes) < 1 or len(k_passes) != len(v_passes):
        raise ValueError(f"k_passes and v_passes must be equally long and non-empty (pass 0 is the trunk), got "
                         f"{len(k_passes)} and {len(v_passes)}")
    if q.dim() != 4:
        raise ValueError(f"q must be [R, S, H, D], got {tuple(q.shape)}")
    R, S, H, D = q.shape
    G = k_passes[0].shape[2] if k_passes[0].dim() == 4 else -1
    for i, (k, v) in enumerate(zip(k_passes, v_passes)):
        if k.shape != (R, S, G, D) or v.shape != k.shape:
            raise ValueError(f"k_passes[{i}] and v_passes[{i}] must be [R={R}, S={S}, G, D={D}] alike, got "
                             f"{tuple(k.shape)} and {tuple(v.shape)}")
    if G < 1 or H % G:
        raise ValueError(f"query heads H={H} must be a multiple of key/value heads G={G}")
    P = len(k_passes) - 1
    if mask is None:
        mask = padded_ttt_mask(S, P, q.device)
    if tuple(mask.shape) != (S, (P + 1) * S):
        raise ValueError(f"mask must be [{S}, {(P + 1) * S}] (padded_ttt_mask), got {tuple(mask.shape)}")
    keys = torch.cat(list(k_passes), dim=1).transpose(1, 2)                      # [R, G, (P+1)S, D]
    vals = torch.cat(list(v_passes), dim=1).transpose(1, 2)
    if G != H:                       # repeat rather than enable_gqa: every SDPA kernel with a mask takes it
        keys, vals = keys.repeat_interleave(H // G, dim=1), vals.repeat_interleave(H // G, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=mask,
                                         scale=D ** -0.5 if scale is None else float(scale))
    return out.transpose(1, 2)                                                   # [R, S, H, D]
