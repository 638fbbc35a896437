"""Trunk + branch attention as one autograd function: the paper's CP mechanism.

The trunk (causal main sequence, or the per-query prefix of DFlash/DSpark blocks) runs on the ring
(ring.py; with one rank it is a single local kernel call), the branch (branch.py) runs on the rank
that owns the query, and the two merge with the LSE rule. Backward uses the *joint* (out, lse) for
both parts: the ring backward replays the trunk, the branch has a closed form. There is no separate
merge backward. Forward communication is the trunk ring's alone, whatever the branches.

    out, lse = trunk_branch_attention(q, trunk_k, trunk_v, plan, group, branch, branch_tensors,
                                      scale=..., backend="auto", stats=None)
"""
from __future__ import annotations

import torch

from kernels.attention.ring import RingStats, ring_backward, ring_forward


class _TrunkBranch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cfg, q, tk, tv, *bt):
        plan, group, branch, scale, backend, stats = cfg
        o_t, l_t = ring_forward(q, tk, tv, plan, group, backend, scale, stats)
        if branch is not None:
            out, lse = branch.merge_forward(q, o_t, l_t, *bt, scale=scale)
        else:
            out, lse = o_t.to(q.dtype), l_t
        del o_t
        ctx.cfg = cfg
        ctx.save_for_backward(q, tk, tv, out, lse, *bt)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        plan, group, branch, scale, backend, stats = ctx.cfg
        q, tk, tv, out, lse, *bt = ctx.saved_tensors
        dout = dout.contiguous()
        dq, dk, dv = ring_backward(dout, q, tk, tv, out, lse, plan, group, backend, scale, stats)
        dbt = ()
        if branch is not None:
            dbt = branch.backward(dout, q, out, lse, *bt, scale=scale, dq=dq)
        return (None, dq.to(q.dtype), dk.to(tk.dtype), dv.to(tv.dtype), *dbt)


def trunk_branch_attention(q, trunk_k, trunk_v, plan, group, branch, branch_tensors=(), *, scale: float,
                           backend="auto", stats: RingStats | None = None):
    """Joint (out, lse) of trunk (ring) + branch (local); out is differentiable, lse is not."""
    return _TrunkBranch.apply((plan, group, branch, scale, backend, stats), q, trunk_k, trunk_v,
                              *branch_tensors)
