"""Grouped-query attention of a decode or verify step on one Triton kernel: a few queries per row over a static
cache view with an additive or a boolean mask (imports only where Triton does; ``kernels.attention.grouped`` decides
when).

At decode sizes SDPA's masked kernel (memory-efficient, the only fused one that takes a mask) launches one program
per 64 query rows per head, pads the handful of queries up to its tile and writes ``[B, H, q, D]``, which the model
then transposes into a copy. Here one program takes one row's key/value head: the ``r = H / G`` query heads that
read it, times the step's ``q`` queries, are the rows of one tile (``tl.dot`` over keys in ``BLOCK_S`` slices, an
online softmax in fp32), every key and value is read once, and the output lands in the ``[B, q, H, D]`` layout the
model's output projection reads. Exact: the same softmax over the same keys per query, an additive mask added to
the scaled scores (a row whose every key is masked that way gets the mean of the values, as SDPA gives it), a
boolean one keeping the keys it marks (a row that sees no key gets 0 where SDPA gives NaN).

    out = torch.ops.repro.grouped_decode_attention(q, k, v, mask, scale)
        # q [B, H, q, D], k/v [B, G, S, D] (rows of D unit-strided), mask [B, 1, q, S] additive or bool:
        # out [B, q, H, D]
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

BLOCK_S = 64


@triton.jit
def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, m_ptr, o_ptr, S, Q, R, G, scale,
                             s_qb, s_qh, s_qq, s_kb, s_kg, s_ks, s_vb, s_vg, s_vs, s_mb, s_mq, s_ob, s_oq, s_oh,
                             BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, D: tl.constexpr, BOOL_MASK: tl.constexpr):
    pid = tl.program_id(0)
    b, g = pid // G, pid % G
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < R * Q
    qq = rows % Q                      # tile row i * Q + t: query head g * R + i, query t of the step
    h = g * R + rows // Q
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * s_qb + h[:, None] * s_qh + qq[:, None] * s_qq + d[None, :], mask=row_ok[:, None],
                other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    k_base, v_base = k_ptr + b * s_kb + g * s_kg, v_ptr + b * s_vb + g * s_vg
    # inductor passes a Python float argument as fp64 (torch._inductor.config._use_fp64_for_unbacked_floats), which
    # would carry fp64 through the online softmax's loop state: one fp32 scale, whatever type arrives
    qk_scale = (tl.full((), 1.0, tl.float32) * scale).to(tl.float32)
    for s0 in range(0, S, BLOCK_S):
        cols = s0 + tl.arange(0, BLOCK_S)
        col_ok = cols < S
        k = tl.load(k_base + cols[:, None] * s_ks + d[None, :], mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * qk_scale
        m_at = m_ptr + b * s_mb + qq[:, None] * s_mq + cols[None, :]
        if BOOL_MASK:
            keep = tl.load(m_at, mask=row_ok[:, None] & col_ok[None, :], other=0) != 0
            s = tl.where(keep & col_ok[None, :], s, float("-inf"))
        else:
            s += tl.load(m_at, mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
            s = tl.where(col_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)      # nothing seen yet: exp(-inf) = 0, not NaN
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * s_vs + d[None, :], mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]          # a row that saw no key: 0
    tl.store(o_ptr + b * s_ob + qq[:, None] * s_oq + h[:, None] * s_oh + d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None])


def launch(q, k, v, mask, scale: float, out, *, block_s: int = BLOCK_S, num_warps: int = 4, kernel=None):
    """Run the kernel into ``out`` ``[B, q, H, D]`` (the op below; tests call it directly under the interpreter)."""
    B, H, Q, D = q.shape
    G, S = k.shape[1], k.shape[2]
    block_m = max(16, triton.next_power_of_2((H // G) * Q))
    (kernel or _decode_attention_kernel)[(B * G,)](
        q, k, v, mask, out, S, Q, H // G, G, scale, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
        k.stride(2), v.stride(0), v.stride(1), v.stride(2), mask.stride(0), mask.stride(2), out.stride(0),
        out.stride(1), out.stride(2), BLOCK_M=block_m, BLOCK_S=block_s, D=D, BOOL_MASK=mask.dtype == torch.bool,
        num_warps=num_warps)
    return out


@triton_op("repro::grouped_decode_attention", mutates_args=())
def grouped_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                             scale: float) -> torch.Tensor:
    """Attention of ``q [B, H, q, D]`` over ``k/v [B, G, S, D]`` with ``mask [B, 1, q, S]`` (additive or bool), out
    ``[B, q, H, D]`` (query head ``h`` reads key/value head ``h // (H / G)``)."""
    B, H, Q, D = q.shape
    out = torch.empty(B, Q, H, D, dtype=q.dtype, device=q.device)
    return launch(q, k, v, mask, scale, out, kernel=wrap_triton(_decode_attention_kernel))
