"""The fp64 dense oracle: attention with an explicit boolean mask, and the three families' masks.

Everything in kernels.attention is checked against ``dense_attention`` (values and autograd
gradients, to 1e-10 in fp64). Rows with no visible key give out = 0, lse = -inf, zero gradient.

    out, lse = dense_attention(q, k, v, mask, scale)                   # q [Tq,H,D], k/v [Tk,G,D]
    mask = causal_mask(cu)                                             # [T, T]
    mask = eagle3_ttt_mask(cu, k)          # keys = cat(pass 0 .. pass k keys) -> [T, (k+1) T]
    mask = block_mask(cu, anchors, B, key_valid, block_valid)
                                           # queries = Nb*B block rows, keys = cat(context T, block rows)
"""
from __future__ import annotations

import torch

from kernels.attention.spec import check_cu


def dense_attention(q, k, v, mask: torch.Tensor, scale: float):
    """Masked softmax attention by autograd-friendly dense ops (GQA by repeating K/V)."""
    Tq, H, D = q.shape
    rep = H // k.shape[1]
    kk = k.repeat_interleave(rep, dim=1)
    vv = v.repeat_interleave(rep, dim=1)
    out = q.new_zeros(Tq, H, D)
    lse = torch.full((Tq, H), float("-inf"), dtype=q.dtype, device=q.device)
    rows = torch.nonzero(mask.any(1)).flatten()
    if rows.numel() == 0:
        return out + 0 * q, lse
    s = torch.einsum("qhd,khd->hqk", q[rows], kk) * scale
    s = s.masked_fill(~mask[rows].unsqueeze(0), float("-inf"))
    l = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - l.unsqueeze(-1))
    o = torch.einsum("hqk,khd->qhd", p, vv)
    out = out.index_copy(0, rows, o)
    lse = lse.index_copy(0, rows, l.transpose(0, 1).detach())
    return out, lse


def causal_mask(cu: torch.Tensor) -> torch.Tensor:
    cu = check_cu(cu, None)
    T = int(cu[-1])
    doc = torch.repeat_interleave(torch.arange(cu.numel() - 1), cu.diff())
    i = torch.arange(T)
    return (doc.unsqueeze(1) == doc.unsqueeze(0)) & (i.unsqueeze(0) <= i.unsqueeze(1))


def eagle3_ttt_mask(cu: torch.Tensor, k: int) -> torch.Tensor:
    """Pass-k queries: causal over pass-0 keys plus the same-position keys of passes 1..k."""
    c = causal_mask(cu)
    T = c.shape[0]
    eye = torch.eye(T, dtype=torch.bool)
    return torch.cat([c] + [eye] * k, dim=1)


def block_mask(cu: torch.Tensor, anchors: torch.Tensor, B: int, key_valid: torch.Tensor | None = None,
               block_valid: torch.Tensor | None = None) -> torch.Tensor:
    """DFlash/DSpark: block b sees context [doc start, anchor) and the valid slots of its own block."""
    cu = check_cu(cu, None)
    T, Nb = int(cu[-1]), anchors.numel()
    key_valid = torch.ones(Nb, B, dtype=torch.bool) if key_valid is None else key_valid.cpu().bool()
    block_valid = torch.ones(Nb, dtype=torch.bool) if block_valid is None else block_valid.cpu().bool()
    a = anchors.cpu().long()
    doc = torch.searchsorted(cu, a, right=True) - 1
    start = cu[doc]
    j = torch.arange(T)
    ctx = (j.unsqueeze(0) >= start.unsqueeze(1)) & (j.unsqueeze(0) < a.unsqueeze(1))    # [Nb, T]
    blk = torch.zeros(Nb, Nb * B, dtype=torch.bool)
    for b in range(Nb):
        blk[b, b * B:(b + 1) * B] = key_valid[b]
    m = torch.cat([ctx, blk], dim=1) & block_valid.unsqueeze(1)
    return m.repeat_interleave(B, dim=0)
