"""The ideal cost model of CP attention (shared/reference/cp_attention.md section 6), in closed form.

Counted per rank and per pass of one layer; independent of the implementation, so tests can check
the ring's counters (RingStats) against it exactly.

    ring_bytes(local_tokens, cp, kv_heads, head_dim, elem_bytes, acc_bytes)   -> {"fwd": .., "bwd": ..}
    zigzag_pairs(cu_seqlens, cp) / sequential_pairs(cu_seqlens, cp, rank)     -> visible (q, k) pairs
    usp_a2a_bytes(...), attention_flops(pairs, heads, head_dim)
"""
from __future__ import annotations

import torch

from kernels.attention.layout import pad_varlen
from kernels.attention.spec import check_cu


def ring_bytes(local_tokens: int, cp: int, kv_heads: int, head_dim: int, elem_bytes: int,
               acc_bytes: int = 4) -> dict[str, int]:
    """Forward: C-1 K/V messages; backward: C-1 K/V messages + C hops of the dK/dV accumulator."""
    kv = 2 * local_tokens * kv_heads * head_dim
    if cp == 1:
        return {"fwd": 0, "bwd": 0}
    return {"fwd": (cp - 1) * kv * elem_bytes, "bwd": (cp - 1) * kv * elem_bytes + cp * kv * acc_bytes}


def ring_messages(cp: int) -> dict[str, int]:
    return {"fwd": cp - 1, "bwd": 2 * cp - 1} if cp > 1 else {"fwd": 0, "bwd": 0}


def zigzag_pairs(cu_seqlens: torch.Tensor, cp: int) -> int:
    """Visible pairs of one zigzag rank (equal on every rank): per document of padded length 2Cc,
    2c(2c+1)/2 on the diagonal step plus C-1 half blocks of 2c^2."""
    cu_pad, _ = pad_varlen(check_cu(cu_seqlens, None), 2 * cp if cp > 1 else 1)
    n = 0
    for Lp in cu_pad.diff().tolist():
        if cp == 1:
            n += Lp * (Lp + 1) // 2
            continue
        c = Lp // (2 * cp)
        n += 2 * c * (2 * c + 1) // 2 + (cp - 1) * 2 * c * c
    return n


def sequential_pairs(cu_seqlens: torch.Tensor, cp: int, rank: int) -> int:
    """Visible pairs of rank r under the sequential split: c(c+1)/2 + r c^2 per document."""
    cu_pad, _ = pad_varlen(check_cu(cu_seqlens, None), cp)
    n = 0
    for Lp in cu_pad.diff().tolist():
        c = Lp // cp
        n += c * (c + 1) // 2 + rank * c * c
    return n


def attention_flops(pairs: int, heads: int, head_dim: int, phase: str = "fwd") -> int:
    """4*H*D per visible pair forward (QK^T and PV); 10*H*D backward (recompute QK^T, dV, dP, dQ, dK)."""
    per = {"fwd": 4, "bwd": 10}[phase]
    return per * heads * head_dim * pairs


def usp_a2a_bytes(batch: int, local_tokens: int, heads: int, kv_heads: int, head_dim: int, U: int,
                  elem_bytes: int) -> int:
    """Forward all-to-all bytes a rank sends per pass: q, k, v in and out back, (U-1)/U of each."""
    if U == 1:
        return 0
    per_tensor = lambda h: batch * local_tokens * h * head_dim * elem_bytes * (U - 1) // U
    return per_tensor(heads) + 2 * per_tensor(kv_heads) + per_tensor(heads)
