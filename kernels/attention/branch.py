"""Rank-local branch attention fused with the LSE merge, and its closed-form backward.

The branch keys of a query live on the rank that owns the query, so no communication is needed:

    TTTBranch     EAGLE-3 training-time test: query row i at pass k sees its own keys from passes
                  1..k (same position i). Scores are per-row dot products: elementwise work, chunked.
    BlockBranch   DFlash/DSpark: each block [anchor, MASK x (B-1)] sees all valid slots of its own
                  block (bidirectional). A batched [Nb, heads, B, B] attention.

``merge_forward(q, o_t, l_t, *tensors, scale)`` merges the trunk partial (o_t, l_t) with the branch
and returns the joint (out, lse). ``backward(dout, q, out, lse, *tensors, scale, dq)`` adds the
branch's share of dq into ``dq`` (in place) and returns the gradients of the branch tensors, using
the joint (out, lse): w = exp(s - lse), dV = w dO, dS = w (dO.V - rowsum(dO*O)). On CUDA devices with Triton,
TTTBranch runs as one kernel each way (ttt_branch_triton.py); elsewhere, and with ``impl="torch"``, as the
chunked torch ops below.
"""
from __future__ import annotations

import torch

from kernels.attention import triton_ops
from kernels.attention.backends.base import acc_dtype

_NEG = float("-inf")
KERNELS = "ttt_branch_triton"


def triton_kernels():
    """kernels.attention.ttt_branch_triton, or None where Triton does not import or its kernels failed (once)."""
    return triton_ops.load(KERNELS)


def _safe(lse: torch.Tensor, fill: float) -> torch.Tensor:
    return torch.where(torch.isneginf(lse), torch.full_like(lse, fill), lse)


def _owned(o: torch.Tensor, q: torch.Tensor, others) -> bool:
    """Whether the trunk result ``o`` may be overwritten by the merged output: q's dtype and shape,
    contiguous, and sharing no memory with the inputs."""
    if o.dtype != q.dtype or o.shape != q.shape or not o.is_contiguous():
        return False
    st = o.untyped_storage()._cdata
    return all(st != t.untyped_storage()._cdata for t in (q, *others))


def _head_sum(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """sum_h w[n, g, h] x[n, g, h, :] -> [n, g, D], one fused multiply-add per head of the group.

    The per-row outer products and head sums of the TTT branch have an inner size of 1 or H/G; as
    batched GEMMs (bmm, einsum) they run as n*G tiny matrix products, several times slower on CPUs
    than these elementwise ops, which also need no [n, G, hg, D] temporary.
    """
    out = w[:, :, 0, None] * x[:, :, 0]
    for h in range(1, w.shape[2]):
        out.addcmul_(w[:, :, h, None], x[:, :, h])
    return out


class TTTBranch:
    """P = pass index k branch keys per row: tensors are ks (P tensors [T,G,D]) then vs (P tensors).

    Rows are processed in chunks of about ``chunk_elems`` elements per [rows, H, D] fp32 temporary
    (32 MB), so the temporaries stay bounded whatever T. The merged output overwrites the trunk's
    result in place when that buffer is ours (single-rank trunk in q's dtype): no second [T, H, D].
    ``impl``: "auto" (the Triton kernels for CUDA tensors that are not fp64, else these ops), "torch"
    or "triton".
    """

    chunk_elems_default = 1 << 23       # 2048 rows at H*D = 4096; larger: fewer launches, more memory

    def __init__(self, num_keys: int, chunk_elems: int | None = None, impl: str = "auto"):
        if impl not in ("auto", "torch", "triton"):
            raise ValueError(f"impl must be 'auto', 'torch' or 'triton', got {impl!r}")
        self.P = num_keys
        self.chunk_elems = chunk_elems or TTTBranch.chunk_elems_default
        self.impl = impl

    def _kernels(self, q):
        """The Triton kernels when they run this call (triton_ops.choose)."""
        return triton_ops.choose(KERNELS, self.impl, "TTTBranch(impl='triton')", q)

    def _on_kernels(self, q, name: str, *args):
        """``kernels.<name>(*args)`` when the kernels run this call, else None (triton_ops.attempt: under "auto" a
        kernel that does not build on this machine warns once and leaves the torch ops in charge)."""
        kernels = self._kernels(q)
        return None if kernels is None else triton_ops.attempt(KERNELS, kernels, self.impl, "TTTBranch", name, *args)

    def _rows(self, q) -> int:
        return max(1, self.chunk_elems // max(1, q.shape[1] * q.shape[2]))

    def merge_forward(self, q, o_t, l_t, *kvs, scale: float):
        P = self.P
        ks, vs = kvs[:P], kvs[P:]
        T, H, D = q.shape
        G = ks[0].shape[1]
        hg = H // G
        acc = acc_dtype(q.dtype)
        out = o_t if _owned(o_t, q, kvs) else torch.empty(T, H, D, dtype=q.dtype, device=q.device)
        lse = l_t if (l_t.dtype == acc and l_t.is_contiguous() and out is o_t) else \
            torch.empty(T, H, dtype=acc, device=q.device)
        res = self._on_kernels(q, "merge_forward", q, o_t, l_t, ks, vs, out, lse, scale)
        if res is not None:
            return res
        chunk = self._rows(q)
        for a in range(0, T, chunk):
            b = min(T, a + chunk)
            n = b - a
            qc = q[a:b].to(acc).view(n, G, hg, D)
            s = torch.stack([torch.einsum("nghd,ngd->ngh", qc, k[a:b].to(acc)) for k in ks]) * scale  # [P,n,G,hg]
            lt = l_t[a:b].to(acc).view(n, G, hg)
            L = torch.logsumexp(torch.cat([lt.unsqueeze(0), s]), dim=0)
            Ls = _safe(L, 0.0)
            oc = torch.empty(n, G, hg, D, dtype=acc, device=q.device)      # contiguous, ours
            torch.mul(o_t[a:b].reshape(n, G, hg, D), torch.exp(lt - Ls).unsqueeze(-1), out=oc)
            for p in range(P):                         # oc += w_p (outer) v_p, in place
                oc.addcmul_(torch.exp(s[p] - Ls).unsqueeze(-1), vs[p][a:b].to(acc).unsqueeze(2))
            out[a:b] = oc.view(n, H, D).to(q.dtype)
            lse[a:b] = L.view(n, H)
        return out, lse

    def backward(self, dout, q, out, lse, *kvs, scale: float, dq: torch.Tensor):
        P = self.P
        ks, vs = kvs[:P], kvs[P:]
        T, H, D = q.shape
        G = ks[0].shape[1]
        hg = H // G
        acc = acc_dtype(q.dtype)
        res = self._on_kernels(q, "backward", dout, q, out, lse, ks, vs, dq, scale)
        if res is not None:
            return (*res[0], *res[1])
        dks = [torch.empty_like(k) for k in ks]
        dvs = [torch.empty_like(v) for v in vs]
        chunk = self._rows(q)
        for a in range(0, T, chunk):
            b = min(T, a + chunk)
            n = b - a
            qc = q[a:b].to(acc).view(n, G, hg, D)
            do = dout[a:b].to(acc).view(n, G, hg, D)
            delta = torch.einsum("nghd,nghd->ngh", do, out[a:b].to(acc).view(n, G, hg, D))
            Ls = _safe(lse[a:b].to(acc), float("inf")).view(n, G, hg)
            dqc = None
            for p in range(P):
                kp, vp = ks[p][a:b].to(acc), vs[p][a:b].to(acc)                        # [n,G,D]
                w = torch.exp(torch.einsum("nghd,ngd->ngh", qc, kp) * scale - Ls)      # [n,G,hg]
                dvs[p][a:b] = _head_sum(w, do).to(dvs[p].dtype)
                ds = w * (torch.einsum("nghd,ngd->ngh", do, vp) - delta) * scale
                outer = (ds.unsqueeze(-1), kp.unsqueeze(2))                    # dq += ds (outer) k_p
                dqc = torch.mul(*outer) if dqc is None else dqc.addcmul_(*outer)
                dks[p][a:b] = _head_sum(ds, qc).to(dks[p].dtype)
            dq[a:b] += dqc.view(n, H, D).to(dq.dtype)
        return (*dks, *dvs)


class BlockBranch:
    """Block-local bidirectional attention; tensors are bk, bv [Nb, B, G, D]; q rows are [Nb*B, H, D]."""

    def __init__(self, block_size: int, key_valid: torch.Tensor):
        self.B = block_size
        self.key_valid = key_valid          # [Nb, B] bool: slot is a visible key (False for invalid blocks)

    def _scores(self, q, bk, scale):
        Nb, B, G, D = bk.shape
        H = q.shape[1]
        acc = acc_dtype(q.dtype)
        qb = q.to(acc).view(Nb, B, G, H // G, D)
        s = torch.einsum("nsghd,ntgd->nghst", qb, bk.to(acc)) * scale
        s = s.masked_fill(~self.key_valid.view(Nb, 1, 1, 1, B), _NEG)
        return qb, s

    def merge_forward(self, q, o_t, l_t, bk, bv, *, scale: float):
        Nb, B, G, D = bk.shape
        H = q.shape[1]
        hg = H // G
        acc = acc_dtype(q.dtype)
        _, s = self._scores(q, bk, scale)                                       # [Nb,G,hg,B,B]
        lt = l_t.to(acc).view(Nb, B, G, hg).permute(0, 2, 3, 1)                # [Nb,G,hg,B]
        L = torch.logsumexp(torch.cat([lt.unsqueeze(-1), s], dim=-1), dim=-1)
        Ls = _safe(L, 0.0)
        p = torch.exp(s - Ls.unsqueeze(-1))
        ot = o_t.to(acc).view(Nb, B, G, hg, D).permute(0, 2, 3, 1, 4)
        o = torch.exp(lt - Ls).unsqueeze(-1) * ot + torch.einsum("nghst,ntgd->nghsd", p, bv.to(acc))
        out = o.permute(0, 3, 1, 2, 4).reshape(Nb * B, H, D).to(q.dtype)
        return out, L.permute(0, 3, 1, 2).reshape(Nb * B, H)

    def backward(self, dout, q, out, lse, bk, bv, *, scale: float, dq: torch.Tensor):
        Nb, B, G, D = bk.shape
        H = q.shape[1]
        hg = H // G
        acc = acc_dtype(q.dtype)
        qb, s = self._scores(q, bk, scale)
        Ls = _safe(lse.to(acc), float("inf")).view(Nb, B, G, hg).permute(0, 2, 3, 1)
        p = torch.exp(s - Ls.unsqueeze(-1))                                     # [Nb,G,hg,Bq,Bk]
        do = dout.to(acc).view(Nb, B, G, hg, D).permute(0, 2, 3, 1, 4)          # [Nb,G,hg,B,D]
        o = out.to(acc).view(Nb, B, G, hg, D).permute(0, 2, 3, 1, 4)
        delta = (do * o).sum(-1)
        dbv = torch.einsum("nghst,nghsd->ntgd", p, do)
        dp = torch.einsum("nghsd,ntgd->nghst", do, bv.to(acc))
        ds = p * (dp - delta.unsqueeze(-1)) * scale
        dq += torch.einsum("nghst,ntgd->nsghd", ds, bk.to(acc)).reshape(Nb * B, H, D).to(dq.dtype)
        dbk = torch.einsum("nghst,nsghd->ntgd", ds, qb)
        return dbk.to(bk.dtype), dbv.to(bv.dtype)
