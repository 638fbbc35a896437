"""Block-draft attention in one kernel call per direction (one rank): context prefix and own block together.

A DFlash/DSpark block query sees the context keys [lo, hi) of its block (document start to anchor) and the
valid slots of its own block. ``block_draft_attention`` runs that as trunk (the ring's prefix mask) + branch
(batched torch ops) + LSE merge, which at one rank is a sequence of small launches. Here the keys are the
context and every block's slots side by side, [context (S rows); blocks (Q rows)], and one flash-attn-4 call
with the "block" mask (kernels/attention/backends/flash4_masks.py) computes the whole attention; the backward
is one call too (block sparsity on sm90 skips the context tiles past each query tile's anchors). The price is
a copy of the context keys/values into the joint key tensor (and of their gradients out of it).

    out = fused_block_attention(q, k, v, ctx_k, ctx_v, ctx_lo, ctx_hi, slot_valid=None, block_valid=None)
        q [R, Q, H, D], k/v [R, Q, G, D]   R rows of N blocks of B slots (Q = N*B; block n = slots nB..nB+B-1)
        ctx_k/ctx_v [R, S, G, D]           each row's context keys/values
        ctx_lo/ctx_hi [R, N] int           block n of row r sees context keys [ctx_lo, ctx_hi) of its row
        slot_valid [R, Q] bool             which slots are visible keys (default all)
        block_valid [R, N] bool            False: the block sees nothing (out 0)
    out = fused_block_draft_attention(q, k, v, ctx_k, ctx_v, anchors, cu_seqlens, slot_valid=, block_valid=)
        block_draft_attention's packed single-rank signature (q [Nb, B, H, D], ctx [T, G, D], global anchors)
    out = one_call_attention(prob, q, k, v, ctx_k, ctx_v, scale)   # a problem built once (block_problem)

``block_draft_attention(..., backend="auto")`` takes this route by itself at one rank on flash-attn-4 up to
``kernels.attention.api.ONE_CALL_MAX_TOKENS`` context rows (its BlockPlan builds the problem once for every layer).
``backend``: "flash4" (the registered flash-attn-4 backend) or a Flash4Backend instance.
"""
from __future__ import annotations

import torch

from kernels.attention import backends
from kernels.attention.backends import flash4_masks
from kernels.attention.backends.flash4 import Flash4Backend, MaskedProblem
from kernels.attention.spec import check_cu
from kernels.attention.staging import to_device


def _backend(backend) -> Flash4Backend:
    b = backends.get(backend) if isinstance(backend, str) else backend
    if not isinstance(b, Flash4Backend):
        raise TypeError(f"the one-call block route runs on flash-attn-4: backend must be 'flash4' or a Flash4Backend, "
                        f"got {backend!r}")
    return b


def block_problem(ctx_lo, ctx_hi, slot_valid, block_valid, B: int, S: int, device=None) -> MaskedProblem:
    """The "block" mask problem over keys [context (S); blocks (Q)] for [R, N] bounds and [R, Q] slots, built
    where the bounds are (on the host: no device work, no waits) for a kernel on ``device`` (default: there)."""
    R, N = ctx_lo.shape
    Q = N * B
    dev = ctx_lo.device
    valid = block_valid.bool()
    lo1 = torch.where(valid, ctx_lo, 0).repeat_interleave(B, dim=1)
    hi1 = torch.where(valid, ctx_hi, 0).repeat_interleave(B, dim=1)
    start = (S + torch.arange(N, device=dev) * B).expand(R, N)
    lo2 = torch.where(valid, start, 0).repeat_interleave(B, dim=1)
    hi2 = torch.where(valid, start + B, 0).repeat_interleave(B, dim=1)
    key_ok = torch.cat([torch.ones(R, S, dtype=torch.bool, device=dev), slot_valid.bool()], dim=1)
    own = (slot_valid.bool().view(R, N, B).any(-1) & valid).repeat_interleave(B, dim=1)
    empty = torch.nonzero(((hi1 <= lo1) & ~own).flatten()).flatten()
    device = dev if device is None else torch.device(device)
    aux = [to_device(a, device) for a in flash4_masks.aux_tensors("block", lo1, hi1, lo2, hi2, key_ok)]
    return MaskedProblem("block", aux, R, Q, S + Q, [(lo1, hi1), (lo2, hi2)], [True, False],
                         to_device(empty, device) if empty.numel() else None)


class _FusedBlock(torch.autograd.Function):
    @staticmethod
    def forward(ctx, backend, prob, scale, q, k, v, ctx_k, ctx_v):
        keys, vals = torch.cat([ctx_k, k], dim=1), torch.cat([ctx_v, v], dim=1)
        out, lse = backend.masked_forward(q, keys, vals, prob, scale)
        ctx.cfg = (backend, prob, scale, ctx_k.shape[1])
        ctx.save_for_backward(q, keys, vals, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        backend, prob, scale, S = ctx.cfg
        q, keys, vals, out, lse = ctx.saved_tensors
        dq, dkeys, dvals = backend.masked_backward(dout.contiguous(), q, keys, vals, out, lse, prob, scale)
        return None, None, None, dq, dkeys[:, S:], dvals[:, S:], dkeys[:, :S], dvals[:, :S]


def one_call_attention(prob: MaskedProblem, q, k, v, ctx_k, ctx_v, scale: float, backend="flash4") -> torch.Tensor:
    """The masked call each way over [context; blocks] for a problem already built (``block_problem``; a
    ``BlockPlan`` keeps one for every layer of a forward: ``block_draft_attention``'s one-rank route)."""
    return _FusedBlock.apply(_backend(backend), prob, float(scale), q, k, v, ctx_k, ctx_v)


def fused_block_attention(q, k, v, ctx_k, ctx_v, ctx_lo, ctx_hi, slot_valid=None, block_valid=None, *,
                          scale: float | None = None, backend="flash4") -> torch.Tensor:
    """Block attention of R rows in one masked call each way; see the module docstring. Shapes only are
    checked (no device reads)."""
    b = _backend(backend)
    if q.dim() != 4 or k.dim() != 4 or k.shape[:2] != q.shape[:2] or v.shape != k.shape:
        raise ValueError(f"q must be [R, Q, H, D] and k/v [R, Q, G, D] alike, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not q.is_floating_point() or not (q.dtype == k.dtype == v.dtype == ctx_k.dtype == ctx_v.dtype):
        raise TypeError(f"q, k, v, ctx_k, ctx_v must share one floating dtype, got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}, {ctx_k.dtype}, {ctx_v.dtype}")
    R, Q, H, D = q.shape
    G = k.shape[2]
    if ctx_k.dim() != 4 or ctx_k.shape[0] != R or ctx_k.shape[2:] != (G, D) or ctx_v.shape != ctx_k.shape:
        raise ValueError(f"ctx_k/ctx_v must be [R={R}, S, G={G}, D={D}], got {tuple(ctx_k.shape)} and "
                         f"{tuple(ctx_v.shape)}")
    if H % G:
        raise ValueError(f"query heads H={H} must be a multiple of key/value heads G={G}")
    if ctx_lo.dim() != 2 or ctx_lo.shape[0] != R or Q % ctx_lo.shape[1] or ctx_hi.shape != ctx_lo.shape:
        raise ValueError(f"ctx_lo/ctx_hi must be [R={R}, N] with N dividing the {Q} block queries, got "
                         f"{tuple(ctx_lo.shape)} and {tuple(ctx_hi.shape)}")
    N, where = ctx_lo.shape[1], ctx_lo.device                  # the problem is built where the bounds are
    slot_valid = torch.ones(R, Q, dtype=torch.bool, device=where) if slot_valid is None else slot_valid
    block_valid = torch.ones(R, N, dtype=torch.bool, device=where) if block_valid is None else block_valid
    if tuple(slot_valid.shape) != (R, Q) or tuple(block_valid.shape) != (R, N):
        raise ValueError(f"slot_valid must be [{R}, {Q}] and block_valid [{R}, {N}], got "
                         f"{tuple(slot_valid.shape)} and {tuple(block_valid.shape)}")
    prob = block_problem(ctx_lo, ctx_hi.to(where), slot_valid.to(where), block_valid.to(where), Q // N,
                         ctx_k.shape[1], device=q.device)
    return one_call_attention(prob, q, k, v, ctx_k, ctx_v, D ** -0.5 if scale is None else scale, b)


def fused_block_draft_attention(q, k, v, ctx_k, ctx_v, anchors, cu_seqlens, *, slot_valid=None, block_valid=None,
                                scale: float | None = None, backend="flash4") -> torch.Tensor:
    """``block_draft_attention`` at one rank (packed documents, global anchors) in one masked call each way."""
    if q.dim() != 4 or k.dim() != 4 or ctx_k.dim() != 3:
        raise ValueError(f"q must be [Nb, B, H, D], k/v [Nb, B, G, D] and ctx_k/ctx_v [T, G, D], got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(ctx_k.shape)}")
    Nb, B = q.shape[:2]
    T = ctx_k.shape[0]
    cu = check_cu(cu_seqlens, T)
    if not isinstance(anchors, torch.Tensor) or anchors.dim() != 1 or anchors.numel() != Nb:
        raise ValueError(f"anchors must be a 1-D tensor of {Nb} global token indices, got "
                         f"{getattr(anchors, 'shape', type(anchors))}")
    if anchors.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"anchors must be int32/int64 token indices, got {anchors.dtype}")
    a = anchors.to("cpu", torch.int64)
    if Nb and (int(a.min()) < 0 or int(a.max()) >= T):
        raise ValueError(f"anchors must lie in [0, {T}), got min {int(a.min())} max {int(a.max())}")
    doc = torch.searchsorted(cu, a, right=True) - 1
    lo, hi = cu[doc].view(1, Nb), a.view(1, Nb)                 # host bounds: the problem is built there
    sv = None if slot_valid is None else slot_valid.reshape(1, Nb * B)
    bv = None if block_valid is None else block_valid.reshape(1, Nb)
    out = fused_block_attention(q.reshape(1, Nb * B, *q.shape[2:]), k.reshape(1, Nb * B, *k.shape[2:]),
                                v.reshape(1, Nb * B, *v.shape[2:]), ctx_k.unsqueeze(0), ctx_v.unsqueeze(0), lo, hi,
                                sv, bv, scale=scale, backend=backend)
    return out.view(q.shape)
