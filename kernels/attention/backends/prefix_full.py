"""Per-query prefix masks run by any backend that can do "full" segments (e.g. flash varlen).

DFlash/DSpark block rows see the keys [segment start, key_end) with key_end shared by the B rows of a
block. Within a segment, sort the distinct key ends e_1 < ... < e_m: the keys split into intervals
I_j = [e_{j-1}, e_j), and row t sees exactly the intervals with e_j <= key_end[t]. Each interval
becomes one "full" segment whose queries are the rows that see it (replicated query rows), so one
varlen call covers every block: with n blocks of B rows in a document the replicated rows number
B n (n+1) / 2 while the FLOPs equal the prefix mask's. Keys are never copied: unseen key ranges become
segments without queries. The replicas are merged back with the LSE rule; backward runs the inner
backward on the replicas with the joint (out, lse) and sums dq over replicas.

    b = PrefixAsFull(inner=SdpaCudaBackend())     # or any backend supporting "full"

On CUDA (not fp64) the fold of the replicas back into their rows, both ways, runs as two Triton kernels
(replica_merge_triton.py) instead of scatters over every replica; ``merge="torch"`` keeps the torch ops
(registered as "prefix_full[<name>]:torch_fold").
"""
from __future__ import annotations

import torch

from kernels.attention import triton_ops
from kernels.attention.backends.base import Backend, acc_dtype
from kernels.attention.spec import MaskSpec
from kernels.attention.staging import to_device
from kernels.backend_names import prefix_full


def _expand(spec: MaskSpec):
    """(replica -> query row index, full MaskSpec over (replicas x all keys)); cached on the spec.

    Vectorised over rows and intervals (a per-block Python loop cost more host time than the kernels at
    RL batch shapes): the intervals are the distinct (segment, key end) pairs; row t belongs to the
    first J_t intervals of its segment (those ending at or before its key end)."""
    if "prefix_full" in spec._cache:
        return spec._cache["prefix_full"]
    cu_q_t, cu_k_t = spec.cu_q.cpu().long(), spec.cu_k.cpu().long()
    S, T, W = cu_q_t.numel() - 1, spec.num_q, spec.num_k + 1
    seg = torch.repeat_interleave(torch.arange(S), cu_q_t.diff())                 # segment of each row
    k0, k1 = cu_k_t[seg], cu_k_t[seg + 1]
    ke = torch.minimum(torch.maximum(spec.key_end, k0), k1)
    code = seg * W + ke                                                           # sorts by (segment, end)
    groups = torch.unique(code[ke > k0])                                          # the intervals, in order
    first = torch.searchsorted(groups, torch.arange(S + 1) * W)                   # each segment's first one
    J = torch.searchsorted(groups, code, right=True) - first[seg]
    t_rep = torch.repeat_interleave(torch.arange(T), J)
    g_rep = first[seg][t_rep] + torch.arange(t_rep.numel()) - torch.repeat_interleave(J.cumsum(0) - J, J)
    idx = t_rep[torch.argsort(g_rep * max(T, 1) + t_rep)]                        # interval-major, rows in order
    counts = torch.bincount(g_rep, minlength=groups.numel()).tolist()
    ends, first_l = (groups % W).tolist(), first.tolist()
    cu_k = cu_k_t.tolist()
    cq, ck, nq = [0], [0], 0
    for s in range(S):
        lo, hi = cu_k[s], cu_k[s + 1]
        if hi > ck[-1] and lo > ck[-1]:           # keys between segments that nobody sees
            cq.append(nq)
            ck.append(lo)
        for g in range(first_l[s], first_l[s + 1]):
            nq += counts[g]
            cq.append(nq)
            ck.append(ends[g])
        if hi > ck[-1]:
            cq.append(nq)
            ck.append(hi)
    if ck[-1] < spec.num_k:
        cq.append(nq)
        ck.append(spec.num_k)
    full = MaskSpec.full(torch.tensor(cq), torch.tensor(ck))
    spec._cache["prefix_full"] = (idx, full)
    return idx, full


def _by_row(spec: MaskSpec, device):
    """The replicas of each row as CSR on ``device``: row t's are pos[ptr[t]:ptr[t+1]]; cached on the spec."""
    key = ("prefix_full_rows", str(device))
    if key not in spec._cache:
        idx, _ = _expand(spec)
        ptr = torch.zeros(spec.num_q + 1, dtype=torch.int64)
        ptr[1:] = torch.bincount(idx, minlength=spec.num_q).cumsum(0)
        spec._cache[key] = (to_device(ptr, device), to_device(torch.argsort(idx, stable=True), device))
    return spec._cache[key]


class PrefixAsFull(Backend):
    KERNELS = "replica_merge_triton"

    def __init__(self, inner: Backend, merge: str = "auto"):
        if merge not in ("auto", "torch", "triton"):
            raise ValueError(f"merge must be 'auto', 'torch' or 'triton', got {merge!r}")
        self.inner, self.merge = inner, merge
        self.name = prefix_full(inner.name, ":torch_fold" if merge == "torch" else "")

    def _fold(self, q, name: str, spec, replicas: tuple, *outs):
        """The Triton fold ``name``(*replicas, CSR of ``spec``'s replicas, *outs) when it runs here
        (triton_ops.choose), else None (torch ops); the CSR is built only then."""
        kernels = triton_ops.choose(self.KERNELS, self.merge, "PrefixAsFull(merge='triton')", q)
        if kernels is None:
            return None
        return triton_ops.attempt(self.KERNELS, kernels, self.merge, self.name, name, *replicas,
                                  *_by_row(spec, q.device), *outs)

    def supports(self, spec, device, dtype) -> bool:
        if spec.kind != "prefix":
            return self.inner.supports(spec, device, dtype)          # other kinds: delegated
        return self.inner.supports(MaskSpec.full(spec.cu_q, spec.cu_k), device, dtype)

    def unavailable_reason(self, spec, device, dtype):
        inner_spec = spec if spec.kind != "prefix" else MaskSpec.full(spec.cu_q, spec.cu_k)
        return self.inner.unavailable_reason(inner_spec, device, dtype)

    def forward(self, q, k, v, spec, scale):
        if spec.kind != "prefix":
            return self.inner.forward(q, k, v, spec, scale)
        idx, full = _expand(spec)
        T, H, D = q.shape
        acc = acc_dtype(q.dtype)
        lse = torch.full((T, H), float("-inf"), dtype=acc, device=q.device)
        if idx.numel() == 0:
            return torch.zeros_like(q), lse
        idx_d = to_device(idx, q.device)
        o_r, l_r = self.inner.forward(q.index_select(0, idx_d), k, v, full, scale)
        l_r = l_r.to(acc)
        folded = self._fold(q, "merge_replicas", spec, (o_r, l_r), torch.empty_like(q), lse)
        if folded is not None:
            return folded
        out = torch.zeros(T, H, D, dtype=acc, device=q.device)
        m = lse.scatter_reduce(0, idx_d.unsqueeze(1).expand_as(l_r), l_r, "amax", include_self=True)
        m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        w = torch.exp(l_r - m_safe.index_select(0, idx_d))                         # -inf -> 0
        s = torch.zeros_like(lse).index_add_(0, idx_d, w)
        out.index_add_(0, idx_d, w.unsqueeze(-1) * o_r.to(acc))
        pos = s > 0
        out = out / torch.where(pos, s, torch.ones_like(s)).unsqueeze(-1)
        lse = torch.where(pos, m_safe + torch.log(torch.where(pos, s, torch.ones_like(s))), lse)
        return out.to(q.dtype), lse

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        if spec.kind != "prefix":
            return self.inner.backward(dout, q, k, v, out, lse, spec, scale)
        idx, full = _expand(spec)
        acc = acc_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        if idx.numel() == 0:
            return dq, torch.zeros(k.shape, dtype=acc, device=q.device), torch.zeros(v.shape, dtype=acc,
                                                                                      device=q.device)
        idx_d = to_device(idx, q.device)
        sel = lambda x: x.index_select(0, idx_d)
        gq, gk, gv = self.inner.backward(sel(dout), sel(q), k, v, sel(out), sel(lse), full, scale)
        if self._fold(q, "sum_replicas", spec, (gq,), dq) is None:
            dq.index_add_(0, idx_d, gq.to(acc))
        return dq, gk, gv
