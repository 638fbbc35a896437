"""GPU cuDNN backend: torch's cuDNN fused attention (``aten._scaled_dot_product_cudnn_attention``).

On Hopper the cuDNN kernels are markedly faster than the bundled flash-attention 2. The op returns
the LSE and its backward takes the joint (out, lse), so it honours the contract. It has no varlen
entry here, so packed segments are looped over (one call per document: fine for long documents,
launch-bound for many short ones). "causal" (Lq == Lk) and "full" kinds, bf16/fp16. GQA is probed
on first use (native, else K/V repeated and gradients summed back).

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
        self._aux: dict = {}

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

    def forward(self, q, k, v, spec, scale):
        T, H, _D = q.shape
        out = torch.zeros_like(q)
        lse = torch.full((T, H), float("-inf"), dtype=torch.float32, device=q.device)
        causal = spec.kind == "causal"
        for _, q0, q1, k0, k1 in spec.segments():
            qs, ks, vs = q[q0:q1], k[k0:k1], v[k0:k1]
            if self.gqa_native is None and k.shape[1] != H:
                try:
                    self.gqa_native = True
                    res = self._fwd(qs, ks, vs, causal, scale)
                except RuntimeError:
                    self.gqa_native = False
                    res = self._fwd(qs, ks, vs, causal, scale)
            else:
                res = self._fwd(qs, ks, vs, causal, scale)
            out[q0:q1] = res[0][0].transpose(0, 1)
            lse[q0:q1] = res[1].reshape(H, q1 - q0).transpose(0, 1)
            self._aux[(q1 - q0, k1 - k0)] = (tuple(res[1].shape[1:]), res[2], res[3], res[4], res[5], res[6],
                                             res[7])
        return out, lse

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        H, G = q.shape[1], k.shape[1]
        dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        dk = torch.zeros(k.shape, dtype=k.dtype, device=q.device)
        dv = torch.zeros(v.shape, dtype=v.dtype, device=q.device)
        causal = spec.kind == "causal"
        for _, q0, q1, k0, k1 in spec.segments():
            L = q1 - q0
            if (L, k1 - k0) not in self._aux:      # backward without a forward of this shape: run one
                self.forward(q[q0:q1], k[k0:k1], v[k0:k1], type(spec).full(torch.tensor([0, L]),
                                                                            torch.tensor([0, k1 - k0])), scale)
            shape, cq, ck, mq, mk, seed, off = self._aux[(L, k1 - k0)]
            l_rows = lse[q0:q1].float()
            l_rows = torch.where(torch.isneginf(l_rows), torch.full_like(l_rows, float("inf")), l_rows)
            l4 = l_rows.transpose(0, 1).contiguous().reshape(1, H, L, *shape[2:])
            gq, gk, gv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
                _bhld(dout[q0:q1].to(q.dtype)), _bhld(q[q0:q1]), _bhld(self._kv(k[k0:k1], H)),
                _bhld(self._kv(v[k0:k1], H)), _bhld(out[q0:q1].to(q.dtype)), l4, seed, off, None, cq, ck,
                mq, mk, 0.0, causal, scale=scale)
            dq[q0:q1] = gq[0].transpose(0, 1)
            gk, gv = gk[0].transpose(0, 1), gv[0].transpose(0, 1)
            if gk.shape[1] != G:
                gk = gk.reshape(k1 - k0, G, H // G, -1).sum(2)
                gv = gv.reshape(k1 - k0, G, H // G, -1).sum(2)
            dk[k0:k1] += gk
            dv[k0:k1] += gv
        return dq, dk, dv
