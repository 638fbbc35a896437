"""GPU cuDNN backend: torch's cuDNN fused attention (``aten._scaled_dot_product_cudnn_attention``).

On Hopper the cuDNN kernels are markedly faster than the bundled flash-attention 2. The op returns
the LSE and its backward takes the joint (out, lse), so it honours the contract. It has no varlen
entry here, so packed segments are looped over (one call per document: fine for long documents,
launch-bound for many short ones). "causal" (Lq == Lk) and "full" kinds, bf16/fp16. GQA is probed
on first use (native, else K/V repeated and gradients summed back).

Memory: a call whose one segment covers every row and key (a long document, a tile of
tiled[cudnn]) returns the kernel's own out / dq, dk, dv, with no zero-filled copies; gradients are
returned as plain tensors (not views), so autograd can sum them in place across passes. The backward
needs the forward's metadata of the same (Lq, Lk) shape only for max_q/max_k and the philox seed and
offset, which no-dropout attention never reads: for shapes no forward ran (tiles) it is derived from
the latest forward instead of running one.

    from kernels.attention.backends.cudnn import CudnnBackend
"""
from __future__ import annotations

import torch

from kernels.attention.backends.base import Backend


def available() -> bool:
    return torch.cuda.is_available() and hasattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention")


def _bhld(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).unsqueeze(0)          # [L, h, D] -> [1, h, L, D] view


class CudnnBackend(Backend):
    name = "cudnn"

    def __init__(self):
        self.gqa_native: bool | None = None
        self._aux: dict = {}          # (Lq, Lk) -> backward metadata of a forward call of that shape
        self._template = None         # the latest such metadata (see _aux_for)

    def supports(self, spec, device, dtype) -> bool:
        return (device.type == "cuda" and spec.kind in ("causal", "full")
                and dtype in (torch.float16, torch.bfloat16) and available())

    def _kv(self, x: torch.Tensor, H: int) -> torch.Tensor:
        if self.gqa_native or x.shape[1] == H:
            return x
        return x.repeat_interleave(H // x.shape[1], dim=1)

    def _fwd(self, q, k, v, causal, scale):
        H = q.shape[1]
        return torch.ops.aten._scaled_dot_product_cudnn_attention(
            _bhld(q), _bhld(self._kv(k, H)), _bhld(self._kv(v, H)), None, True, 0.0, causal, False, scale=scale)

    def _call(self, qs, ks, vs, causal, scale):
        H = qs.shape[1]
        if self.gqa_native is None and ks.shape[1] != H:
            try:
                self.gqa_native = True
                return self._fwd(qs, ks, vs, causal, scale)
            except RuntimeError:
                self.gqa_native = False
        return self._fwd(qs, ks, vs, causal, scale)

    def forward(self, q, k, v, spec, scale):
        T, H, _D = q.shape
        causal = spec.kind == "causal"
        segs = list(spec.segments())
        if len(segs) == 1 and segs[0][1:] == (0, T, 0, k.shape[0]):
            # One segment covering every row and key (long documents, tiles): the kernel's own output
            # is the result; no zero-filled copy.
            res = self._call(q, k, v, causal, scale)
            self._remember(T, k.shape[0], res)
            out = res[0][0].transpose(0, 1)
            return (out.detach() if out.is_contiguous() else out.contiguous()), res[1].reshape(H, T).transpose(0, 1)
        out = torch.empty_like(q)
        lse = torch.full((T, H), float("-inf"), dtype=torch.float32, device=q.device)
        covered = 0
        for _, q0, q1, k0, k1 in segs:
            res = self._call(q[q0:q1], k[k0:k1], v[k0:k1], causal, scale)
            out[q0:q1] = res[0][0].transpose(0, 1)
            lse[q0:q1] = res[1].reshape(H, q1 - q0).transpose(0, 1)
            self._remember(q1 - q0, k1 - k0, res)
            covered += q1 - q0
        if covered < T:                                # rows of segments without keys: out = 0
            out[torch.isneginf(lse[:, 0])] = 0
        return out, lse

    def _remember(self, L: int, Lk: int, res) -> None:
        self._aux[(L, Lk)] = (tuple(res[1].shape[1:]), res[2], res[3], res[4], res[5], res[6], res[7])
        self._template = self._aux[(L, Lk)]

    def _aux_for(self, L: int, Lk: int):
        """Backward metadata of an (L, Lk) call: from a forward of that shape, else derived from any
        forward (no dropout: the philox seed/offset are never read; max_q/max_k are the lengths)."""
        if (L, Lk) in self._aux:
            return self._aux[(L, Lk)]
        t = self._template
        return ((t[0][0], L, *t[0][2:]), t[1], t[2], L, Lk, t[5], t[6])

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        causal = spec.kind == "causal"
        segs = list(spec.segments())
        if self._template is None and segs:      # backward before any forward: one forward for metadata
            _, q0, q1, k0, k1 = segs[0]
            self._remember(q1 - q0, k1 - k0, self._call(q[q0:q1], k[k0:k1], v[k0:k1], causal, scale))
        if len(segs) == 1 and segs[0][1:] == (0, q.shape[0], 0, k.shape[0]):
            return self._bwd_segment(dout, q, k, v, out, lse, causal, scale)   # no zero-filled copies
        dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        dk = torch.zeros(k.shape, dtype=k.dtype, device=q.device)
        dv = torch.zeros(v.shape, dtype=v.dtype, device=q.device)
        for _, q0, q1, k0, k1 in segs:
            gq, gk, gv = self._bwd_segment(dout[q0:q1], q[q0:q1], k[k0:k1], v[k0:k1], out[q0:q1], lse[q0:q1],
                                           causal, scale)
            dq[q0:q1] = gq
            dk[k0:k1] += gk
            dv[k0:k1] += gv
        return dq, dk, dv

    def _bwd_segment(self, dout, q, k, v, out, lse, causal, scale):
        """(dq, dk, dv) of one segment: rows q against keys k (all visible up to the causal rule)."""
        L, H, _D = q.shape
        Lk, G = k.shape[0], k.shape[1]
        shape, cq, ck, mq, mk, seed, off = self._aux_for(L, Lk)
        l_rows = lse.float()
        l_rows = torch.where(torch.isneginf(l_rows), torch.full_like(l_rows, float("inf")), l_rows)
        l4 = l_rows.transpose(0, 1).contiguous().reshape(1, H, L, *shape[2:])
        gq, gk, gv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            _bhld(dout.to(q.dtype)), _bhld(q), _bhld(self._kv(k, H)), _bhld(self._kv(v, H)),
            _bhld(out.to(q.dtype)), l4, seed, off, None, cq, ck, mq, mk, 0.0, causal, scale=scale)
        gq, gk, gv = gq[0].transpose(0, 1), gk[0].transpose(0, 1), gv[0].transpose(0, 1)
        if gk.shape[1] != G:
            gk = gk.reshape(Lk, G, H // G, -1).sum(2)
            gv = gv.reshape(Lk, G, H // G, -1).sum(2)
        # detach(): plain tensors, not views of the kernel's [1, h, L, D] outputs, so that autograd can
        # sum gradients arriving from several passes in place instead of allocating the sum.
        return gq.detach(), gk.detach(), gv.detach()
