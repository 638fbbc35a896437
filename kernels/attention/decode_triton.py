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
    out = torch.ops.repro.grouped_decode_attention_write(q, k, v, k_new, v_new, cols, mask, scale, frontier)
        # the step's keys/values k_new/v_new [B, G, q, D] written into k/v's columns cols ([q], or [B, q]: each
        # row its own) first, by the same kernel (the cache write of a decoder layer and its attention in one
        # launch); frontier=True: the caller's mask hides every column past a row's last new one, so the kernel
        # reads each row's keys only up to there (rows of different lengths in one cache view)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

BLOCK_S = 64


@triton.jit
def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, m_ptr, o_ptr, kn_ptr, vn_ptr, c_ptr, S, Q, R, G, scale,
                             s_qb, s_qh, s_qq, s_kb, s_kg, s_ks, s_vb, s_vg, s_vs, s_mb, s_mq, s_ob, s_oq, s_oh,
                             s_knb, s_kng, s_knq, s_vnb, s_vng, s_vnq, s_cb,
                             BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, D: tl.constexpr, BOOL_MASK: tl.constexpr,
                             WRITE: tl.constexpr, BLOCK_Q: tl.constexpr, FRONTIER: tl.constexpr):
    pid = tl.program_id(0)
    # 64-bit row offsets: a static cache stacks every layer's columns, so b * s_kb passes 2**31 elements at sizes a
    # GPU rollout reaches (64 rows x 8 heads x 28 layers x 1280 columns x 128: k = 7, 144 new tokens), and Triton
    # multiplies i32 by i32
    b, g = (pid // G).to(tl.int64), pid % G
    d = tl.arange(0, D)
    k_base, v_base = k_ptr + b * s_kb + g * s_kg, v_ptr + b * s_vb + g * s_vg
    S_row = S                          # the keys this row reads
    if WRITE:
        # the step's own keys and values into the cache columns c_ptr[t] first (this row's key/value head: no other
        # program reads them), then a CTA barrier, after which this program's reads of those columns see them
        t = tl.arange(0, BLOCK_Q)
        t_ok = t < Q
        c = tl.load(c_ptr + b * s_cb + t, mask=t_ok, other=0)       # s_cb = 0: one set of columns for all rows
        kn = tl.load(kn_ptr + b * s_knb + g * s_kng + t[:, None] * s_knq + d[None, :], mask=t_ok[:, None], other=0.0)
        tl.store(k_base + c[:, None] * s_ks + d[None, :], kn.to(k_ptr.dtype.element_ty), mask=t_ok[:, None])
        vn = tl.load(vn_ptr + b * s_vnb + g * s_vng + t[:, None] * s_vnq + d[None, :], mask=t_ok[:, None], other=0.0)
        tl.store(v_base + c[:, None] * s_vs + d[None, :], vn.to(v_ptr.dtype.element_ty), mask=t_ok[:, None])
        tl.debug_barrier()
        if FRONTIER:                   # nothing past the row's last new column is visible: not read
            S_row = tl.minimum(tl.max(tl.where(t_ok, c, -1), 0).to(tl.int32) + 1, S)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < R * Q
    qq = rows % Q                      # tile row i * Q + t: query head g * R + i, query t of the step
    h = g * R + rows // Q
    q = tl.load(q_ptr + b * s_qb + h[:, None] * s_qh + qq[:, None] * s_qq + d[None, :], mask=row_ok[:, None],
                other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    # inductor passes a Python float argument as fp64 (torch._inductor.config._use_fp64_for_unbacked_floats), which
    # would carry fp64 through the online softmax's loop state: one fp32 scale, whatever type arrives
    qk_scale = (tl.full((), 1.0, tl.float32) * scale).to(tl.float32)
    for s0 in range(0, S_row, BLOCK_S):
        cols = s0 + tl.arange(0, BLOCK_S)
        col_ok = cols < S_row
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


def launch(q, k, v, mask, scale: float, out, *, block_s: int = BLOCK_S, num_warps: int = 4, kernel=None,
           new: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, frontier: bool = False):
    """Run the kernel into ``out`` ``[B, q, H, D]`` (the ops below; tests call it directly under the interpreter);
    ``new``: ``(k_new, v_new [B, G, q, D], cols [q] or [B, q])``, written into ``k``/``v``'s columns ``cols`` first
    (``[B, q]``: row b's into its columns ``cols[b]``); ``frontier`` (with ``new``): row b reads keys only up to its
    last new column, the caller's mask hiding every column past it."""
    B, H, Q, D = q.shape
    G, S = k.shape[1], k.shape[2]
    block_m = max(16, triton.next_power_of_2((H // G) * Q))
    kn, vn, cols = new if new is not None else (k, v, out)        # unread placeholders without a write
    per_row = new is not None and cols.dim() == 2
    if per_row:
        cols = cols.contiguous()
    (kernel or _decode_attention_kernel)[(B * G,)](
        q, k, v, mask, out, kn, vn, cols, S, Q, H // G, G, scale, q.stride(0), q.stride(1), q.stride(2), k.stride(0),
        k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), mask.stride(0), mask.stride(2),
        out.stride(0), out.stride(1), out.stride(2), kn.stride(0), kn.stride(1), kn.stride(2), vn.stride(0),
        vn.stride(1), vn.stride(2), cols.stride(0) if per_row else 0, BLOCK_M=block_m, BLOCK_S=block_s, D=D,
        BOOL_MASK=mask.dtype == torch.bool, WRITE=new is not None, BLOCK_Q=triton.next_power_of_2(Q),
        FRONTIER=new is not None and frontier, num_warps=num_warps)
    return out


@triton_op("repro::grouped_decode_attention", mutates_args=())
def grouped_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                             scale: float) -> torch.Tensor:
    """Attention of ``q [B, H, q, D]`` over ``k/v [B, G, S, D]`` with ``mask [B, 1, q, S]`` (additive or bool), out
    ``[B, q, H, D]`` (query head ``h`` reads key/value head ``h // (H / G)``)."""
    B, H, Q, D = q.shape
    out = torch.empty(B, Q, H, D, dtype=q.dtype, device=q.device)
    return launch(q, k, v, mask, scale, out, kernel=wrap_triton(_decode_attention_kernel))


@triton_op("repro::grouped_decode_attention_write", mutates_args=("k", "v"))
def grouped_decode_attention_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_new: torch.Tensor,
                                   v_new: torch.Tensor, cols: torch.Tensor, mask: torch.Tensor,
                                   scale: float, frontier: bool = False) -> torch.Tensor:
    """``k[:, :, cols] = k_new`` and ``v[:, :, cols] = v_new`` (``[B, G, q, D]``, ``cols`` q distinct columns of the
    cache view, or ``[B, q]``: each row's own), then ``grouped_decode_attention(q, k, v, mask, scale)``: one kernel
    for a layer's cache write and attention. ``frontier``: the mask hides every column past a row's last new one,
    and the kernel does not read them."""
    B, H, Q, D = q.shape
    out = torch.empty(B, Q, H, D, dtype=q.dtype, device=q.device)
    return launch(q, k, v, mask, scale, out, kernel=wrap_triton(_decode_attention_kernel), new=(k_new, v_new, cols),
                  frontier=frontier)
