"""Ring attention over any torch.distributed group: K/V circulate, queries stay (forward and backward).

``ring_forward`` runs a ``RingPlan`` (plan.py): at step s the rank computes its partial result against
the K/V it holds while the next K/V block is already in flight (one ``batch_isend_irecv`` per step,
K and V packed in one message), and merges partials with the LSE rule in fp32 (fp64 for fp64).
``ring_backward`` replays the ring with the *joint* (out, lse): K/V circulate again, and an fp32 dK/dV
accumulator travels one hop behind them, so after C hops each rank holds its own dK/dV.
``RingStats`` counts bytes, messages and visible (query, key) pairs per phase; the cost model
(cost_model.py) predicts them exactly.

    stats = RingStats()
    out, lse = ring_forward(q, k, v, plan, group, "auto", scale, stats)
    dq, dk, dv = ring_backward(dout, q, k, v, out, lse, plan, group, "auto", scale, stats)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from kernels.attention import backends
from kernels.attention.backends.base import acc_dtype
from kernels.attention.layout import group_rank_size
from kernels.attention.merge import merge_
from kernels.attention.plan import RingPlan, StepPlan


@dataclass
class RingStats:
    """Counters of one rank; ``bytes``/``messages``/``pairs`` are keyed by phase ("fwd", "bwd")."""

    bytes: dict = field(default_factory=lambda: {"fwd": 0, "bwd": 0})
    messages: dict = field(default_factory=lambda: {"fwd": 0, "bwd": 0})
    pairs: dict = field(default_factory=lambda: {"fwd": 0, "bwd": 0})
    calls: dict = field(default_factory=lambda: {"fwd": 0, "bwd": 0})

    def as_dict(self) -> dict:
        return {"bytes": dict(self.bytes), "messages": dict(self.messages), "pairs": dict(self.pairs),
                "calls": dict(self.calls)}


class RingComm:
    """Send to rank+1 and receive from rank-1 of ``group`` with batched isend/irecv; counts bytes."""

    def __init__(self, group, stats: RingStats | None, phase: str):
        self.group = group
        self.rank, self.size = group_rank_size(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)
        self.stats, self.phase = stats, phase

    def exchange(self, send: torch.Tensor, recv: torch.Tensor, tag: int = 0) -> list:
        ops = [dist.P2POp(dist.isend, send, self.next, self.group, tag),
               dist.P2POp(dist.irecv, recv, self.prev, self.group, tag)]
        works = dist.batch_isend_irecv(ops)
        if self.stats is not None:
            self.stats.bytes[self.phase] += send.numel() * send.element_size()
            self.stats.messages[self.phase] += 1
        return works


def _wait(works) -> None:
    for w in works or ():
        w.wait()


def _sel(x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    return x if rows is None else x.index_select(0, rows)


def _step_fwd(q, k, v, sp: StepPlan, backend, scale):
    qs, ks, vs = _sel(q, sp.q_rows), _sel(k, sp.k_rows), _sel(v, sp.k_rows)
    b = backends.select(backend, sp.spec, q.device, q.dtype)
    return b.forward(qs, ks, vs, sp.spec, scale)


def _step_bwd(dout, q, k, v, out, lse, sp: StepPlan, backend, scale):
    r = sp.q_rows
    b = backends.select(backend, sp.spec, q.device, q.dtype)
    return b.backward(_sel(dout, r), _sel(q, r), _sel(k, sp.k_rows), _sel(v, sp.k_rows), _sel(out, r),
                      _sel(lse, r), sp.spec, scale)


def ring_forward(q, k, v, plan: RingPlan, group, backend, scale: float, stats: RingStats | None = None):
    """Partial attention of local queries against every rank's K/V; returns (out, lse).

    With one rank the backend's result is returned as is (out in q's dtype), else out is the fp32/fp64
    accumulator.
    """
    _, C = group_rank_size(group)
    if stats is not None:
        stats.calls["fwd"] += 1
    T, H, D = q.shape
    acc = acc_dtype(q.dtype)
    if C == 1:
        sp = plan.diag
        if stats is not None:
            stats.pairs["fwd"] += sp.pairs()
        o, l = _step_fwd(q, k, v, sp, backend, scale)
        if sp.q_rows is None:
            return o, l
        out = q.new_zeros(T, H, D)
        lse = torch.full((T, H), float("-inf"), dtype=l.dtype, device=q.device)
        out.index_copy_(0, sp.q_rows, o.to(out.dtype))
        lse.index_copy_(0, sp.q_rows, l)
        return out, lse
    out = lse = None
    comm = RingComm(group, stats, "fwd")
    kv = torch.stack([k, v])
    for s in range(C):
        works, nxt = None, None
        if s < C - 1:
            nxt = torch.empty_like(kv)
            works = comm.exchange(kv, nxt, tag=0)
        sp = plan.for_step(s)
        if sp is not None:
            if stats is not None:
                stats.pairs["fwd"] += sp.pairs()
            o, l = _step_fwd(q, kv[0], kv[1], sp, backend, scale)
            if out is None and sp.q_rows is None:      # the first partial is the accumulator (a fresh tensor)
                out, lse = o.to(acc), l.to(acc)
            else:
                if out is None:
                    out = torch.zeros(T, H, D, dtype=acc, device=q.device)
                    lse = torch.full((T, H), float("-inf"), dtype=acc, device=q.device)
                merge_(out, lse, o, l, sp.q_rows)
        if works is not None:
            _wait(works)
            kv = nxt
    if out is None:                                    # no step had queries (e.g. no block on this rank)
        out = torch.zeros(T, H, D, dtype=acc, device=q.device)
        lse = torch.full((T, H), float("-inf"), dtype=acc, device=q.device)
    return out, lse


def ring_backward(dout, q, k, v, out, lse, plan: RingPlan, group, backend, scale: float,
                  stats: RingStats | None = None):
    """Gradients of the joint attention w.r.t. local q and local k, v; ``out``/``lse`` are joint."""
    _, C = group_rank_size(group)
    if stats is not None:
        stats.calls["bwd"] += 1
    acc = acc_dtype(q.dtype)
    if C == 1:
        sp = plan.diag
        if stats is not None:
            stats.pairs["bwd"] += sp.pairs()
        gq, gk, gv = _step_bwd(dout, q, k, v, out, lse, sp, backend, scale)
        if sp.q_rows is None:
            return gq, gk, gv
        dq = torch.zeros(q.shape, dtype=gq.dtype, device=q.device)
        dq.index_add_(0, sp.q_rows, gq)
        return dq, gk, gv
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    comm = RingComm(group, stats, "bwd")
    kv = torch.stack([k, v])
    pending, incoming = None, None
    for s in range(C):
        kv_works, nxt = None, None
        if s < C - 1:
            nxt = torch.empty_like(kv)
            kv_works = comm.exchange(kv, nxt, tag=0)
        contrib = torch.zeros(kv.shape, dtype=acc, device=q.device)
        sp = plan.for_step(s)
        if sp is not None:
            if stats is not None:
                stats.pairs["bwd"] += sp.pairs()
            if sp.q_rows is None and sp.k_rows is None:       # every trunk step: straight into the sums
                b = backends.select(backend, sp.spec, q.device, q.dtype)
                b.backward_into(dout, q, kv[0], kv[1], out, lse, sp.spec, scale, dq, contrib[0], contrib[1])
            else:
                gq, gk, gv = _step_bwd(dout, q, kv[0], kv[1], out, lse, sp, backend, scale)
                if sp.q_rows is None:
                    dq += gq
                else:
                    dq.index_add_(0, sp.q_rows, gq.to(acc))
                if sp.k_rows is None:
                    contrib[0] += gk
                    contrib[1] += gv
                else:
                    contrib[0].index_add_(0, sp.k_rows, gk.to(acc))
                    contrib[1].index_add_(0, sp.k_rows, gv.to(acc))
        if pending is not None:
            _wait(pending)
            contrib += incoming
        incoming = torch.empty_like(contrib)
        pending = comm.exchange(contrib, incoming, tag=1)   # a fresh buffer: never reused in flight
        if kv_works is not None:
            _wait(kv_works)
            kv = nxt
    _wait(pending)
    return dq, incoming[0], incoming[1]
