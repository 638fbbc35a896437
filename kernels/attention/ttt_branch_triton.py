"""Triton kernels of the EAGLE-3 TTT branch (branch.py's TTTBranch) for CUDA devices: one launch each way.

Row t at pass P sees, besides its trunk keys, its own keys of passes 1..P (same position t): per K/V head g the
branch is P dot products per query head of the group, so the work is elementwise over rows. The torch path of
TTTBranch runs it as ~20 ops per chunk of rows with fp32 temporaries; these kernels read every input once:

    merge_forward(q, o_t, l_t, ks, vs, out, lse, scale) -> (out, lse)
                                                         the trunk partial (o_t, l_t) merged with the branch
                                                         keys (online softmax in fp32); out may be o_t
    backward(dout, q, out, lse, ks, vs, dq, scale) -> (dks, dvs)
                                                         from the joint (out, lse): dq += the branch's share
                                                         (in place), and the gradients of the branch keys

One program covers ``BT`` rows of one K/V head and the H/G query heads that read it, as a [BT, heads, D] tile.
The P key tensors (and, backward, their gradients) are reached through one device table of their addresses (they
are separate allocations of one layout). Tested against the torch path and the fp64 reference under Triton's CPU
interpreter (tests/attention/test_ttt_branch_triton.py); the GPU attention check runs it against fp64 on the device.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attention.staging import to_device

TILE_ELEMS = 4096          # BT * heads-per-group * D elements per fp32 tile: 16 registers a thread at 4 warps


@triton.jit
def _tile(T, HG: tl.constexpr, D: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr):
    """This program's rows, K/V head g, query heads and dims, and the masks of its [BT, BH], [BT, BH, BD] and
    [BT, BD] (key) tiles."""
    rows = (tl.program_id(0) * BT + tl.arange(0, BT)).to(tl.int64)      # row x stride passes 2**31 past 512K tokens
    g = tl.program_id(1)
    heads = g * HG + tl.arange(0, BH)
    dims = tl.arange(0, BD)
    m_h = (rows < T)[:, None] & (tl.arange(0, BH) < HG)[None, :]
    m_3 = m_h[:, :, None] & (dims < D)[None, None, :]
    m_k = (rows < T)[:, None] & (dims < D)[None, :]
    return rows, g, heads, dims, m_h, m_3, m_k


@triton.jit
def _merge_fwd(q, o_t, l_t, out, lse, tab, T, scale,
               sq_t, sq_h, so_t, so_h, sl_t, sl_h, sout_t, sout_h, slse_t, slse_h, sk_t, sk_g,
               HG: tl.constexpr, D: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr,
               P: tl.constexpr):
    rows, g, heads, dims, m_h, m_3, m_k = _tile(T, HG, D, BH, BD, BT)
    r3, h3, d3 = rows[:, None, None], heads[None, :, None], dims[None, None, :]
    qv = tl.load(q + r3 * sq_t + h3 * sq_h + d3, mask=m_3, other=0.0).to(tl.float32)
    acc = tl.load(o_t + r3 * so_t + h3 * so_h + d3, mask=m_3, other=0.0).to(tl.float32)
    m = tl.load(l_t + rows[:, None] * sl_t + heads[None, :] * sl_h, mask=m_h, other=float("-inf")).to(tl.float32)
    ssum = tl.where(m == float("-inf"), 0.0, 1.0)                # the trunk partial enters with weight exp(l_t)
    acc = acc * ssum[:, :, None]
    k_off = rows[:, None] * sk_t + g * sk_g + dims[None, :]
    for p in tl.static_range(P):
        kp = tl.load(tab + p).to(tl.pointer_type(q.dtype.element_ty))
        vp = tl.load(tab + P + p).to(tl.pointer_type(q.dtype.element_ty))
        kv = tl.load(kp + k_off, mask=m_k, other=0.0).to(tl.float32)
        vv = tl.load(vp + k_off, mask=m_k, other=0.0).to(tl.float32)
        s = tl.sum(qv * kv[:, None, :], axis=2) * scale                          # [BT, BH]
        mn = tl.maximum(m, s)
        a = tl.exp(m - mn)                                                       # m = -inf -> 0
        w = tl.exp(s - mn)
        acc = acc * a[:, :, None] + w[:, :, None] * vv[:, None, :]
        ssum = ssum * a + w
        m = mn
    o = acc / ssum[:, :, None]
    tl.store(out + r3 * sout_t + h3 * sout_h + d3, o.to(out.dtype.element_ty), mask=m_3)
    tl.store(lse + rows[:, None] * slse_t + heads[None, :] * slse_h, m + tl.log(ssum), mask=m_h)


@triton.jit
def _branch_bwd(dout, q, out, lse, dq, tab, T, scale,
                sdo_t, sdo_h, sq_t, sq_h, so_t, so_h, sl_t, sl_h, sdq_t, sdq_h, sk_t, sk_g,
                HG: tl.constexpr, D: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr,
                P: tl.constexpr):
    rows, g, heads, dims, m_h, m_3, m_k = _tile(T, HG, D, BH, BD, BT)
    r3, h3, d3 = rows[:, None, None], heads[None, :, None], dims[None, None, :]
    qv = tl.load(q + r3 * sq_t + h3 * sq_h + d3, mask=m_3, other=0.0).to(tl.float32)
    do = tl.load(dout + r3 * sdo_t + h3 * sdo_h + d3, mask=m_3, other=0.0).to(tl.float32)
    ov = tl.load(out + r3 * so_t + h3 * so_h + d3, mask=m_3, other=0.0).to(tl.float32)
    delta = tl.sum(do * ov, axis=2)                                                # rowsum(dO * O), [BT, BH]
    L = tl.load(lse + rows[:, None] * sl_t + heads[None, :] * sl_h, mask=m_h, other=float("inf")).to(tl.float32)
    L = tl.where(L == float("-inf"), float("inf"), L)                               # rows that saw nothing: P = 0
    dqa = tl.zeros([BT, BH, BD], dtype=tl.float32)
    k_off = rows[:, None] * sk_t + g * sk_g + dims[None, :]
    for p in tl.static_range(P):
        kp = tl.load(tab + p).to(tl.pointer_type(q.dtype.element_ty))
        vp = tl.load(tab + P + p).to(tl.pointer_type(q.dtype.element_ty))
        dkp = tl.load(tab + 2 * P + p).to(tl.pointer_type(q.dtype.element_ty))
        dvp = tl.load(tab + 3 * P + p).to(tl.pointer_type(q.dtype.element_ty))
        kv = tl.load(kp + k_off, mask=m_k, other=0.0).to(tl.float32)
        vv = tl.load(vp + k_off, mask=m_k, other=0.0).to(tl.float32)
        w = tl.exp(tl.sum(qv * kv[:, None, :], axis=2) * scale - L)                # [BT, BH]
        ds = w * (tl.sum(do * vv[:, None, :], axis=2) - delta) * scale
        dqa += ds[:, :, None] * kv[:, None, :]
        tl.store(dvp + k_off, tl.sum(w[:, :, None] * do, axis=1).to(q.dtype.element_ty), mask=m_k)
        tl.store(dkp + k_off, tl.sum(ds[:, :, None] * qv, axis=1).to(q.dtype.element_ty), mask=m_k)
    dq_ptr = dq + r3 * sdq_t + h3 * sdq_h + d3
    dqv = tl.load(dq_ptr, mask=m_3, other=0.0).to(tl.float32)
    tl.store(dq_ptr, (dqv + dqa).to(dq.dtype.element_ty), mask=m_3)


def _rowwise(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _table(tensors, like: torch.Tensor) -> torch.Tensor:
    """The tensors' addresses, on ``like``'s device (the kernels index them with one layout), copied without making
    the host wait for the stream."""
    t = torch.tensor([x.data_ptr() for x in tensors], dtype=torch.int64)
    return to_device(t, like.device)


def _keys(ks, vs):
    """ks and vs [T, G, D] with one common stride (all copied contiguous when they differ)."""
    kv = [_rowwise(t) for t in (*ks, *vs)]
    if len({t.stride() for t in kv}) > 1:
        kv = [t.contiguous() for t in kv]
    return kv[:len(ks)], kv[len(ks):]


def _shape(q: torch.Tensor, G: int):
    T, H, D = q.shape
    HG = H // G
    BH, BD = triton.next_power_of_2(HG), triton.next_power_of_2(D)
    BT = max(1, min(64, TILE_ELEMS // (BH * BD)))
    return T, HG, D, BH, BD, BT


def merge_forward(q, o_t, l_t, ks, vs, out, lse, scale: float):
    """Write the merged (out [T, H, D], lse [T, H] fp32) of the trunk partial and the branch keys ks/vs; returns
    (out, lse)."""
    ks, vs = _keys(ks, vs)
    q, o_t = _rowwise(q), _rowwise(o_t)
    G = ks[0].shape[1]
    T, HG, D, BH, BD, BT = _shape(q, G)
    if T == 0:
        return out, lse
    _merge_fwd[(triton.cdiv(T, BT), G)](
        q, o_t, l_t, out, lse, _table((*ks, *vs), q), T, scale,
        q.stride(0), q.stride(1), o_t.stride(0), o_t.stride(1), l_t.stride(0), l_t.stride(1),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1), ks[0].stride(0), ks[0].stride(1),
        HG=HG, D=D, BH=BH, BD=BD, BT=BT, P=len(ks), num_warps=4)
    return out, lse


def backward(dout, q, out, lse, ks, vs, dq, scale: float):
    """dq += the branch's share of the joint gradient (in place); returns (dks, dvs), the gradients of ks/vs."""
    ks, vs = _keys(ks, vs)
    if dq.stride(-1) != 1:
        raise ValueError(f"dq must have a contiguous last dim, got strides {dq.stride()}")
    dks, dvs = [torch.empty_like(ks[0]) for _ in ks], [torch.empty_like(vs[0]) for _ in vs]
    dout, q, out = _rowwise(dout), _rowwise(q), _rowwise(out)
    G = ks[0].shape[1]
    T, HG, D, BH, BD, BT = _shape(q, G)
    if T == 0:
        return [d.zero_() for d in dks], [d.zero_() for d in dvs]
    _branch_bwd[(triton.cdiv(T, BT), G)](
        dout, q, out, lse, dq, _table((*ks, *vs, *dks, *dvs), q), T, scale,
        dout.stride(0), dout.stride(1), q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        lse.stride(0), lse.stride(1), dq.stride(0), dq.stride(1), ks[0].stride(0), ks[0].stride(1),
        HG=HG, D=D, BH=BH, BD=BD, BT=BT, P=len(ks), num_warps=4)
    return dks, dvs
