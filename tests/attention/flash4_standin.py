"""A stand-in for ``flash_attn.cute`` (flash-attn-4) that computes the same functions in fp64 torch on the CPU.

It implements the interface facts the adapter (kernels/attention/backends/flash4.py) relies on, as read from
flash-attn-4 4.0.0b36's flash_attn/cute/interface.py, and asserts the argument conventions the real kernels
assert (int32 contiguous cu_seqlens on the data's device, lse [H, total_q] / [R, H, Sq] fp32, equal dtypes):

  flash_attn_varlen_func(q, k, v, cu_seqlens_q=, cu_seqlens_k=, max_seqlen_q=, max_seqlen_k=, softmax_scale=,
                         causal=, return_lse=) -> (out, lse [H, T])      causal aligned bottom-right
  flash_attn_func(q [R, Sq, H, D], k, v, softmax_scale=, causal=, mask_mod=, aux_tensors=,
                  block_sparse_tensors=, return_lse=) -> (out, lse [R, H, Sq])   causal aligned bottom-right
  interface._flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale, causal, softcap, ..., cu_seqlens_q/k,
                            max_seqlen_q/k, dq=, dk=, dv=, mask_mod, aux_tensors, block_sparse_tensors)
                            -> (dq, dk, dv), written into the given outputs when passed
  block_sparsity.BlockSparseTensorsTorch

GQA maps query head h to K/V head h // (H / G). A mask function is a marker naming one of
kernels/attention/backends/flash4_masks.MASKS, evaluated with its torch reference. Block-sparsity tables are
honoured the way the kernels use them: key tiles not listed for a query tile are skipped, "full" tiles get
no mask, "partial" ones the mask (the backward reads the transposed, per-key-tile tables), so wrong tables
give wrong results here. Rows of varlen segments without keys get NaN: the adapter must overwrite them.
``CALLS`` records (function, details) per call; ``FAIL`` makes chosen calls raise (fallback tests).
"""
from __future__ import annotations

import importlib.machinery
import itertools
import sys
import types
from typing import NamedTuple

import torch

from kernels.attention.backends import flash4_masks

CALLS: list = []
FAIL: set = set()          # {"sparse", "mask"}: raise when block-sparse tables / any mask function is passed


class MaskRef:
    def __init__(self, name: str):
        self.name = name


class BlockSparseTensorsTorch(NamedTuple):
    mask_block_cnt: torch.Tensor
    mask_block_idx: torch.Tensor
    full_block_cnt: torch.Tensor | None = None
    full_block_idx: torch.Tensor | None = None
    cu_total_m_blocks: torch.Tensor | None = None
    cu_block_idx_offsets: torch.Tensor | None = None
    block_size: tuple | None = None


def _check_cu(cu, x, name):
    assert cu.dtype == torch.int32, f"{name} must be int32, got {cu.dtype}"
    assert cu.device == x.device and cu.stride(0) == 1, f"{name} must be contiguous on the data's device"


def _segments(cu_q, cu_k, max_q, max_k):
    cq, ck = cu_q.tolist(), cu_k.tolist()
    assert len(cq) == len(ck)
    lq = [b - a for a, b in itertools.pairwise(cq)]
    lk = [b - a for a, b in itertools.pairwise(ck)]
    assert max_q == max(lq) and max_k == max(lk), f"max_seqlen ({max_q}, {max_k}) != ({max(lq)}, {max(lk)})"
    return list(zip(cq, cq[1:], ck, ck[1:]))


def _varlen_mask(cu_q, cu_k, max_q, max_k, causal, Tq, Tk):
    m = torch.zeros(Tq, Tk, dtype=torch.bool)
    for q0, q1, k0, k1 in _segments(cu_q, cu_k, max_q, max_k):
        blk = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool)
        if causal:
            i = torch.arange(q1 - q0)[:, None]
            j = torch.arange(k1 - k0)[None, :]
            blk = j <= i + (k1 - k0) - (q1 - q0)
        m[q0:q1, k0:k1] = blk
    return m


def _tables_mask(t: BlockSparseTensorsTorch, R, Sq, Sk, by_key: bool):
    """[R, Sq, Sk] (0: skipped, 1: partial -> mask, 2: full) from per-query-tile or per-key-tile tables."""
    bq, bk = t.block_size
    out = torch.zeros(R, Sq, Sk, dtype=torch.int8)
    for r in range(R):
        rr = r if t.mask_block_cnt.shape[0] > 1 else 0
        for kind, cnt, idx in ((1, t.mask_block_cnt, t.mask_block_idx), (2, t.full_block_cnt, t.full_block_idx)):
            if cnt is None:
                continue
            assert cnt.dtype == torch.int32 and idx.dtype == torch.int32
            assert cnt.stride(-1) == 1 and idx.stride(-1) == 1, \
                f"Expected strides[leading_dim] == 1, but got {idx.stride(-1)}."       # as the kernels check
            for a in range(cnt.shape[-1]):
                for b in idx[rr, 0, a, :int(cnt[rr, 0, a])].tolist():
                    i, j = (b, a) if by_key else (a, b)
                    out[r, i * bq:(i + 1) * bq, j * bk:(j + 1) * bk] = kind
    return out


def _masked(mask_mod, aux, sparse, R, Sq, Sk, by_key):
    if "mask" in FAIL:
        raise RuntimeError("stand-in: mask_mod route made to fail")
    allowed = flash4_masks.reference(mask_mod.name, aux, R, Sq, Sk)
    if sparse is None:
        return allowed
    if "sparse" in FAIL:
        raise RuntimeError("stand-in: block-sparse route made to fail")
    tab = _tables_mask(sparse, R, Sq, Sk, by_key)
    return (tab == 2) | ((tab == 1) & allowed)


def _attend(q, k, v, mask, scale):
    """fp64 attention per batch row: q [R, Sq, H, D], mask [R, Sq, Sk] -> (out, lse [R, H, Sq]); empty: 0, -inf."""
    H, G = q.shape[2], k.shape[2]
    kk = k.double().repeat_interleave(H // G, dim=2)
    vv = v.double().repeat_interleave(H // G, dim=2)
    s = torch.einsum("rqhd,rkhd->rhqk", q.double(), kk) * scale
    s = s.masked_fill(~mask[:, None], float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), 0, lse)[..., None])
    return torch.einsum("rhqk,rkhd->rqhd", p, vv), lse


def _grads(q, k, v, out, dout, lse, mask, scale):
    H, G = q.shape[2], k.shape[2]
    kk = k.double().repeat_interleave(H // G, dim=2)
    vv = v.double().repeat_interleave(H // G, dim=2)
    s = torch.einsum("rqhd,rkhd->rhqk", q.double(), kk) * scale
    s = s.masked_fill(~mask[:, None], float("-inf"))
    p = torch.exp(s - lse.double()[..., None])                          # lse +inf -> 0
    do = dout.double()
    delta = (do * out.double()).sum(-1).transpose(1, 2)                 # rowsum(dO * O), [R, H, Sq]
    ds = p * (torch.einsum("rqhd,rkhd->rhqk", do, vv) - delta[..., None])
    R, Sk, D = k.shape[0], k.shape[1], k.shape[-1]
    dq = torch.einsum("rhqk,rkhd->rqhd", ds, kk) * scale
    dk = (torch.einsum("rhqk,rqhd->rkhd", ds, q.double()) * scale).view(R, Sk, G, H // G, D).sum(3)
    dv = torch.einsum("rhqk,rqhd->rkhd", p, do).view(R, Sk, G, H // G, D).sum(3)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                           max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None, gather_kv_indices=None,
                           page_table=None, softmax_scale=None, causal=False, window_size=(None, None),
                           learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False,
                           score_mod=None, score_mod_bwd=None, mask_mod=None, block_sparse_tensors=None,
                           aux_tensors=None, aux_scalars=None, return_lse=False, scheduler_metadata=None,
                           seqlen_k_per_split=None, disable_scheduler_metadata=False):
    assert mask_mod is None and block_sparse_tensors is None, "the adapter runs masks on the batched layout"
    _check_cu(cu_seqlens_q, q, "cu_seqlens_q")
    _check_cu(cu_seqlens_k, q, "cu_seqlens_k")
    assert q.dtype == k.dtype == v.dtype and q.shape[1] % k.shape[1] == 0
    CALLS.append(("varlen", {"causal": causal}))
    mask = _varlen_mask(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, q.shape[0], k.shape[0])
    out, lse = _attend(q[None], k[None], v[None], mask[None], softmax_scale)
    out, lse = out[0], lse[0].float()
    lk = cu_seqlens_k.diff().long()
    seg = torch.repeat_interleave(torch.arange(lk.numel()), cu_seqlens_q.diff().long())
    keyless = lk[seg] == 0
    out[keyless] = float("nan")                                  # the adapter must set these rows itself
    lse[:, keyless] = float("nan")
    return out.to(q.dtype), (lse.contiguous() if return_lse else None)


def flash_attn_func(q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False,
                    window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                    deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None, aux_tensors=None,
                    aux_scalars=None, block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False):
    assert q.dim() == 4 and k.shape == v.shape and q.dtype == k.dtype == v.dtype
    R, Sq, Sk = q.shape[0], q.shape[1], k.shape[1]
    if mask_mod is None:                                 # causal (aligned bottom-right) or full
        assert block_sparse_tensors is None
        CALLS.append(("func", {"causal": causal}))
        cu_q, cu_k = torch.tensor([0, Sq], dtype=torch.int32), torch.tensor([0, Sk], dtype=torch.int32)
        mask = _varlen_mask(cu_q, cu_k, Sq, Sk, causal, Sq, Sk)[None].expand(R, Sq, Sk)
        out, lse = _attend(q, k, v, mask, softmax_scale)
        return out.to(q.dtype), (lse.float().contiguous() if return_lse else None)
    assert not causal
    CALLS.append(("func", {"mask": mask_mod.name, "sparse": block_sparse_tensors is not None}))
    mask = _masked(mask_mod, aux_tensors, block_sparse_tensors, R, Sq, Sk, by_key=False)
    out, lse = _attend(q, k, v, mask, softmax_scale)
    return out.to(q.dtype), (lse.float().contiguous() if return_lse else None)


def _flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale=None, causal=False, softcap=0.0, window_size_left=None,
                    window_size_right=None, m_block_size=64, n_block_size=128, num_threads=256, pack_gqa=False,
                    num_stages_Q=2, num_stages_dO=2, SdP_swapAB=False, dKV_swapAB=False, dQ_swapAB=False,
                    AtomLayoutMSdP=2, AtomLayoutNdKV=2, AtomLayoutMdQ=2, V_in_regs=False, cu_seqlens_q=None,
                    cu_seqlens_k=None, seqused_q=None, seqused_k=None, max_seqlen_q=None, max_seqlen_k=None,
                    deterministic=False, dq=None, dk=None, dv=None, score_mod=None, score_mod_bwd=None,
                    mask_mod=None, aux_tensors=None, aux_scalars=None, block_sparse_tensors=None, dlse=None,
                    learnable_sink=None):
    assert q.dtype == k.dtype == v.dtype == out.dtype == dout.dtype, "inputs must have the same dtype"
    assert lse.dtype == torch.float32, "lse must be float32"
    assert softcap == 0.0 and not deterministic
    for t in (q, k, v, out, dout, lse):
        assert t.stride(-1) == 1, "maybe_contiguous would copy this (the adapter should not pass it)"
    given = (dq, dk, dv)
    for g, x in zip(given, (q, k, v)):
        assert g is None or (g.shape == x.shape and g.dtype == x.dtype and g.stride(-1) == 1), "bad output tensor"
    if cu_seqlens_q is not None:
        assert block_sparse_tensors is None, "Varlen backward with block sparsity is not yet supported"
        _check_cu(cu_seqlens_q, q, "cu_seqlens_q")
        T, H = q.shape[:2]
        assert lse.shape == (H, T), "lse must have shape (num_head, total_q)"
        CALLS.append(("bwd_varlen", {"causal": causal, "heads": H}))
        mask = _varlen_mask(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, T, k.shape[0])
        g = _grads(q[None], k[None], v[None], out[None], dout[None], lse[None], mask[None], softmax_scale)
        return _into(given, (g[0][0], g[1][0], g[2][0]))
    R, Sq, H, _D = q.shape
    assert lse.shape == (R, H, Sq), "lse must have shape (batch_size, num_head, seqlen_q)"
    assert mask_mod is not None
    CALLS.append(("bwd_func", {"mask": mask_mod.name, "sparse": block_sparse_tensors is not None, "heads": H}))
    mask = _masked(mask_mod, aux_tensors, block_sparse_tensors, R, Sq, k.shape[1], by_key=True)
    return _into(given, _grads(q, k, v, out, dout, lse, mask, softmax_scale))


def _into(given, grads):
    """The kernel writes caller-given dq/dk/dv (any strides) and returns them; else fresh tensors."""
    return tuple(g if d is None else d.copy_(g) for d, g in zip(given, grads))


def install(monkeypatch) -> None:
    """Put the stand-in into sys.modules (``import flash_attn.cute`` finds it) and mask markers into the adapter."""
    pkg = types.ModuleType("flash_attn")
    pkg.__path__ = []
    cute = types.ModuleType("flash_attn.cute")
    cute.__version__ = "stand-in"
    iface = types.ModuleType("flash_attn.cute.interface")
    bs = types.ModuleType("flash_attn.cute.block_sparsity")
    iface.flash_attn_varlen_func, iface.flash_attn_func = flash_attn_varlen_func, flash_attn_func
    iface._flash_attn_bwd = _flash_attn_bwd
    cute.flash_attn_varlen_func, cute.flash_attn_func = flash_attn_varlen_func, flash_attn_func
    bs.BlockSparseTensorsTorch = BlockSparseTensorsTorch
    pkg.cute, cute.interface, cute.block_sparsity = cute, iface, bs
    for name, mod in (("flash_attn", pkg), ("flash_attn.cute", cute), ("flash_attn.cute.interface", iface),
                      ("flash_attn.cute.block_sparsity", bs)):
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)      # importlib.util.find_spec reads it
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(flash4_masks, "cute_mask", MaskRef)
    CALLS.clear()
    FAIL.clear()
