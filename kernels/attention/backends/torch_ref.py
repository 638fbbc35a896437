"""Pure-torch attention backend: explicit scores per packed segment, any dtype, any mask kind.

It is the fp64 oracle's kernel (run it on fp64 tensors) and the universal fallback: CPU or GPU,
causal/full/prefix masks, GQA without repeating K/V. Scores are formed per segment in query chunks
so memory stays bounded (``max_elems`` score elements per chunk). Not fast; exact.

    from kernels.attention.backends.torch_ref import TorchBackend
    out, lse = TorchBackend().forward(q, k, v, MaskSpec.causal(cu), scale)
"""
from __future__ import annotations

import torch

from kernels.attention.backends.base import Backend, acc_dtype
from kernels.attention.spec import MaskSpec


def _mask(spec: MaskSpec, q0: int, q1: int, k0: int, k1: int, seg_q0: int, device) -> torch.Tensor | None:
    """Boolean [q1-q0, k1-k0] visibility for rows q0..q1 of a segment starting at seg_q0 (None = all)."""
    if spec.kind == "full":
        return None
    kj = torch.arange(k0, k1, device=device)
    if spec.kind == "causal":
        qi = torch.arange(q0 - seg_q0, q1 - seg_q0, device=device)
        return kj.unsqueeze(0) - k0 <= qi.unsqueeze(1)
    return kj.unsqueeze(0) < spec.key_end[q0:q1].to(device).unsqueeze(1)


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, max_elems: int = 1 << 24, compute_dtype: torch.dtype | None = None):
        self.max_elems = max_elems
        self.compute_dtype = compute_dtype   # e.g. bf16 matmuls on GPU; None = acc dtype

    def supports(self, spec, device, dtype) -> bool:
        return True

    def _chunks(self, spec: MaskSpec, heads: int):
        for s, q0, q1, k0, k1 in spec.segments():
            step = max(1, self.max_elems // max(1, heads * (k1 - k0)))
            for a in range(q0, q1, step):
                yield q0, a, min(q1, a + step), k0, k1

    def _scores(self, q, k, spec, seg_q0, a, b, k0, k1, scale):
        acc = acc_dtype(q.dtype)
        cd = self.compute_dtype or acc
        G = k.shape[1]
        hg = q.shape[1] // G
        qs = q[a:b].to(cd).view(b - a, G, hg, -1)
        ks = k[k0:k1].to(cd)
        s = torch.einsum("qghd,kgd->ghqk", qs, ks).to(acc) * scale
        m = _mask(spec, a, b, k0, k1, seg_q0, q.device)
        if m is not None:
            s = s.masked_fill(~m, float("-inf"))
        return s, m

    def forward(self, q, k, v, spec, scale):
        T, H, D = q.shape
        k.shape[1]
        acc = acc_dtype(q.dtype)
        cd = self.compute_dtype or acc
        out = torch.zeros(T, H, D, dtype=acc, device=q.device)
        lse = torch.full((T, H), float("-inf"), dtype=acc, device=q.device)
        for seg_q0, a, b, k0, k1 in self._chunks(spec, H):
            s, _ = self._scores(q, k, spec, seg_q0, a, b, k0, k1, scale)
            l = torch.logsumexp(s, dim=-1)                                      # [G, hg, n]
            p = torch.exp(s - torch.where(torch.isneginf(l), torch.zeros_like(l), l).unsqueeze(-1))
            o = torch.einsum("ghqk,kgd->qghd", p.to(cd), v[k0:k1].to(cd)).to(acc)
            out[a:b] = o.reshape(b - a, H, D)
            lse[a:b] = l.permute(2, 0, 1).reshape(b - a, H)
        return out.to(q.dtype), lse

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        T, H, D = q.shape
        G = k.shape[1]
        hg = H // G
        acc = acc_dtype(q.dtype)
        cd = self.compute_dtype or acc
        dq = torch.zeros(T, H, D, dtype=acc, device=q.device)
        dk = torch.zeros(k.shape, dtype=acc, device=q.device)
        dv = torch.zeros(v.shape, dtype=acc, device=q.device)
        delta = (dout.to(acc) * out.to(acc)).sum(-1)                           # [T, H]
        lse_safe = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse.to(acc))
        for seg_q0, a, b, k0, k1 in self._chunks(spec, H):
            s, _ = self._scores(q, k, spec, seg_q0, a, b, k0, k1, scale)
            l = lse_safe[a:b].reshape(b - a, G, hg).permute(1, 2, 0).unsqueeze(-1)
            p = torch.exp(s - l)                                              # masked -> 0
            do = dout[a:b].to(cd).view(b - a, G, hg, D)
            dv[k0:k1] += torch.einsum("ghqk,qghd->kgd", p.to(cd), do).to(acc)
            dp = torch.einsum("qghd,kgd->ghqk", do, v[k0:k1].to(cd)).to(acc)
            dl = delta[a:b].reshape(b - a, G, hg).permute(1, 2, 0).unsqueeze(-1)
            ds = (p * (dp - dl) * scale).to(cd)
            dq[a:b] += torch.einsum("ghqk,kgd->qghd", ds, k[k0:k1].to(cd)).reshape(b - a, H, D).to(acc)
            dk[k0:k1] += torch.einsum("ghqk,qghd->kgd", ds, q[a:b].to(cd).view(b - a, G, hg, D)).to(acc)
        return dq, dk, dv
