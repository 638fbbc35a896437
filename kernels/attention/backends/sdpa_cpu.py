"""CPU flash backend: torch's private fused CPU SDPA kernels, which return and accept the LSE.

``aten._scaled_dot_product_flash_attention_for_cpu`` gives (out, logsumexp) and its ``_backward``
takes the joint (out, logsumexp), which is exactly the contract. The ops have no varlen path, so we
loop over packed segments; the prefix kind uses an additive float mask (rows that see nothing are
left out and reported as out = 0, lse = -inf); GQA repeats K/V per segment and sums the gradients
back. fp32 and fp64. Private aten ops: verified on torch 2.13 CPU; ``available()`` probes them.

    from kernels.attention.backends.sdpa_cpu import SdpaCpuBackend
"""
from __future__ import annotations

import torch

from kernels.attention.backends.base import Backend, acc_dtype
from kernels.attention.spec import MaskSpec


def available() -> bool:
    return hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu") and hasattr(
        torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward")


def _bhld(x: torch.Tensor, rep: int) -> torch.Tensor:
    x = x.transpose(0, 1)                                # [heads, L, D]
    if rep > 1:
        x = x.repeat_interleave(rep, dim=0)
    return x.unsqueeze(0)


class SdpaCpuBackend(Backend):
    name = "sdpa_cpu"

    def supports(self, spec, device, dtype) -> bool:
        return device.type == "cpu" and dtype in (torch.float32, torch.float64) and available()

    def _rows_and_mask(self, spec: MaskSpec, q0, q1, k0, k1, dtype):
        """(row indices or None, additive mask or None, is_causal) for one segment."""
        if spec.kind == "full":
            return None, None, False
        if spec.kind == "causal":
            return None, None, True
        ke = spec.key_end[q0:q1].cpu()
        rows = torch.nonzero(ke > k0).flatten()
        kj = torch.arange(k0, k1)
        vis = kj.unsqueeze(0) < ke[rows].unsqueeze(1)
        mask = torch.zeros(vis.shape, dtype=dtype).masked_fill_(~vis, float("-inf"))
        return rows, mask, False

    def forward(self, q, k, v, spec, scale):
        T, H, D = q.shape
        rep = H // k.shape[1]
        acc = acc_dtype(q.dtype)
        out = torch.zeros(T, H, D, dtype=q.dtype)
        lse = torch.full((T, H), float("-inf"), dtype=acc)
        for _, q0, q1, k0, k1 in spec.segments():
            rows, mask, causal = self._rows_and_mask(spec, q0, q1, k0, k1, q.dtype)
            qs = q[q0:q1] if rows is None else q[q0:q1].index_select(0, rows)
            if qs.shape[0] == 0:
                continue
            o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                _bhld(qs, 1), _bhld(k[k0:k1], rep), _bhld(v[k0:k1], rep), 0.0, causal,
                attn_mask=mask, scale=scale)
            o, l = o[0].transpose(0, 1), l[0].transpose(0, 1).to(acc)
            if rows is None:
                out[q0:q1], lse[q0:q1] = o, l
            else:
                out[q0:q1].index_copy_(0, rows, o)
                lse[q0:q1].index_copy_(0, rows, l)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        T, H, D = q.shape
        G = k.shape[1]
        rep = H // G
        acc = acc_dtype(q.dtype)
        dq = torch.zeros(T, H, D, dtype=acc)
        dk = torch.zeros(k.shape, dtype=acc)
        dv = torch.zeros(v.shape, dtype=acc)
        # Rows with joint lse = -inf saw nothing anywhere: drop their gradient (lse=+inf makes P = 0).
        lse_safe = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse).to(q.dtype)
        for _, q0, q1, k0, k1 in spec.segments():
            rows, mask, causal = self._rows_and_mask(spec, q0, q1, k0, k1, q.dtype)

            def sel(x, q0=q0, q1=q1, rows=rows):
                return x[q0:q1] if rows is None else x[q0:q1].index_select(0, rows)
            qs = sel(q)
            if qs.shape[0] == 0:
                continue
            g = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                _bhld(sel(dout).to(q.dtype), 1), _bhld(qs, 1), _bhld(k[k0:k1], rep),
                _bhld(v[k0:k1], rep), _bhld(sel(out).to(q.dtype), 1),
                sel(lse_safe).transpose(0, 1).unsqueeze(0).contiguous(), 0.0, causal,
                attn_mask=mask, scale=scale)
            gq = g[0][0].transpose(0, 1).to(acc)
            gk = g[1][0].view(G, rep, k1 - k0, D).sum(1).transpose(0, 1).to(acc)
            gv = g[2][0].view(G, rep, k1 - k0, D).sum(1).transpose(0, 1).to(acc)
            if rows is None:
                dq[q0:q1] += gq
            else:
                dq[q0:q1].index_add_(0, rows, gq)
            dk[k0:k1] += gk
            dv[k0:k1] += gv
        return dq, dk, dv
