"""The exact online-softmax (LSE) merge of two partial attention results, NaN-free.

Two partial results over disjoint key sets, ``(out_a, lse_a)`` and ``(out_b, lse_b)``, combine as
    lse = log(exp(lse_a) + exp(lse_b)),   out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b
(the paper's Eq. 2). Rows where both sides saw no key (both lse = -inf) give out = 0, lse = -inf,
never NaN. ``merge_`` accumulates in place into an fp32/fp64 accumulator (the ring uses it).

    out, lse = merge(out_a, lse_a, out_b, lse_b)     # out [T, H, D], lse [T, H]
"""
from __future__ import annotations

import torch

NEG_INF = float("-inf")


def _weights(lse_a: torch.Tensor, lse_b: torch.Tensor):
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)   # both -inf: weights exp(-inf) = 0
    wa, wb = torch.exp(lse_a - m), torch.exp(lse_b - m)
    s = wa + wb
    lse = m + torch.log(s)                                       # s == 0 -> -inf
    inv = torch.where(s > 0, 1.0 / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(s))
    return wa * inv, wb * inv, lse


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor):
    """Merge two partial (out [T,H,D], lse [T,H]) pairs; computed in lse's dtype, out in out_a's dtype."""
    if out_a.shape != out_b.shape or lse_a.shape != lse_b.shape or out_a.shape[:-1] != lse_a.shape:
        raise ValueError(f"merge needs matching shapes, got out {tuple(out_a.shape)}/{tuple(out_b.shape)} "
                         f"and lse {tuple(lse_a.shape)}/{tuple(lse_b.shape)}")
    acc = torch.promote_types(lse_a.dtype, torch.float32)
    ca, cb, lse = _weights(lse_a.to(acc), lse_b.to(acc))
    out = ca.unsqueeze(-1) * out_a.to(acc) + cb.unsqueeze(-1) * out_b.to(acc)
    return out.to(out_a.dtype), lse


def merge_(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
           rows: torch.Tensor | None = None) -> None:
    """In place: ``acc[rows] <- merge(acc[rows], (out, lse))``; ``rows`` None means all rows."""
    if rows is None:
        ca, cb, new = _weights(acc_lse, lse.to(acc_lse.dtype))
        acc_out.mul_(ca.unsqueeze(-1)).addcmul_(cb.unsqueeze(-1), out.to(acc_out.dtype))
        acc_lse.copy_(new)
        return
    a_out, a_lse = acc_out.index_select(0, rows), acc_lse.index_select(0, rows)
    ca, cb, new = _weights(a_lse, lse.to(acc_lse.dtype))
    acc_out.index_copy_(0, rows, ca.unsqueeze(-1) * a_out + cb.unsqueeze(-1) * out.to(acc_out.dtype))
    acc_lse.index_copy_(0, rows, new)
