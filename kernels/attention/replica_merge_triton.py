"""Triton kernels that fold replicated query rows back into their rows (prefix_full.py) on CUDA devices.

prefix_full runs a prefix mask as full segments whose query rows are replicas: row t appears once per key
interval it sees. Forward, the replicas' partial results merge into row t by the LSE rule; backward, the
replicas' dq sum into row t. As torch ops both are scatters (index_add, scatter_reduce) over every replica with
fp32 temporaries of the replicas' size; here one program per (row, block of heads) walks the row's replicas
(``ptr`` / ``pos``: CSR, the replicas of row t are pos[ptr[t]:ptr[t+1]]) and reads each once:

    merge_replicas(o_r, l_r, ptr, pos, out, lse) -> (out, lse)   o_r [N, H, D], l_r [N, H] fp32 (any strides)
                                                                out [T, H, D] (any float dtype), lse [T, H] fp32
    sum_replicas(g_r, ptr, pos, dq) -> dq                        dq [T, H, D] written with the sums

A row without replicas gets out = 0, lse = -inf (merge) and dq = 0 (sum). Tested against the torch ops under
Triton's CPU interpreter (tests/attention/test_replica_merge_triton.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE_ELEMS = 4096          # heads * D fp32 elements per program


@triton.jit
def _merge(o_r, l_r, ptr, pos, out, lse, H, so_n, so_h, sl_n, sl_h, sout_t, sout_h, slse_t, slse_h,
           D: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)            # t x stride passes 2**31 past 512K tokens of 32 x 128
    heads = tl.program_id(1) * BH + tl.arange(0, BH)
    dims = tl.arange(0, BD)
    m_h = heads < H
    m_2 = m_h[:, None] & (dims < D)[None, :]
    start, end = tl.load(ptr + t), tl.load(ptr + t + 1)
    m = tl.full([BH], float("-inf"), tl.float32)
    s = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, BD], tl.float32)
    for i in range(start, end):
        n = tl.load(pos + i).to(tl.int64)
        lv = tl.load(l_r + n * sl_n + heads * sl_h, mask=m_h, other=float("-inf"))
        ov = tl.load(o_r + n * so_n + heads[:, None] * so_h + dims[None, :], mask=m_2, other=0.0).to(tl.float32)
        m_new = tl.maximum(m, lv)
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)        # all -inf so far: every weight is exp(-inf) = 0
        alpha, w = tl.exp(m - ref), tl.exp(lv - ref)
        s = s * alpha + w
        acc = acc * alpha[:, None] + w[:, None] * ov
        m = m_new
    seen = s > 0
    o = tl.where(seen[:, None], acc / tl.where(seen, s, 1.0)[:, None], 0.0)
    lo = tl.where(seen, m + tl.log(tl.where(seen, s, 1.0)), float("-inf"))
    tl.store(out + t * sout_t + heads[:, None] * sout_h + dims[None, :], o.to(out.dtype.element_ty), mask=m_2)
    tl.store(lse + t * slse_t + heads * slse_h, lo, mask=m_h)


@triton.jit
def _sum(g_r, ptr, pos, dq, H, sg_n, sg_h, sdq_t, sdq_h, D: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)            # t x stride passes 2**31 past 512K tokens of 32 x 128
    heads = tl.program_id(1) * BH + tl.arange(0, BH)
    dims = tl.arange(0, BD)
    m_2 = (heads < H)[:, None] & (dims < D)[None, :]
    start, end = tl.load(ptr + t), tl.load(ptr + t + 1)
    acc = tl.zeros([BH, BD], tl.float32)
    for i in range(start, end):
        n = tl.load(pos + i).to(tl.int64)
        acc += tl.load(g_r + n * sg_n + heads[:, None] * sg_h + dims[None, :], mask=m_2, other=0.0).to(tl.float32)
    tl.store(dq + t * sdq_t + heads[:, None] * sdq_h + dims[None, :], acc.to(dq.dtype.element_ty), mask=m_2)


def _grid(T: int, H: int, D: int):
    BD = triton.next_power_of_2(D)
    BH = max(1, min(triton.next_power_of_2(H), TILE_ELEMS // BD))
    return (T, triton.cdiv(H, BH)), BH, BD


def _rowwise(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def merge_replicas(o_r, l_r, ptr, pos, out, lse):
    """Write into out [T, H, D] / lse [T, H] the LSE merge of each row's replicas; returns (out, lse)."""
    T, H, D = out.shape
    if T == 0:
        return out, lse
    o_r, out = _rowwise(o_r), _rowwise(out)
    grid, BH, BD = _grid(T, H, D)
    _merge[grid](o_r, l_r, ptr, pos, out, lse, H, o_r.stride(0), o_r.stride(1), l_r.stride(0), l_r.stride(1),
                 out.stride(0), out.stride(1), lse.stride(0), lse.stride(1), D=D, BH=BH, BD=BD, num_warps=4)
    return out, lse


def sum_replicas(g_r, ptr, pos, dq):
    """Write into dq [T, H, D] the sum of each row's replica gradients; returns dq."""
    T, H, D = dq.shape
    if T == 0:
        return dq
    if dq.stride(-1) != 1:
        raise ValueError(f"dq must have a contiguous last dim, got strides {dq.stride()}")
    g_r = _rowwise(g_r)
    grid, BH, BD = _grid(T, H, D)
    _sum[grid](g_r, ptr, pos, dq, H, g_r.stride(0), g_r.stride(1), dq.stride(0), dq.stride(1), D=D, BH=BH, BD=BD,
               num_warps=4)
    return dq
