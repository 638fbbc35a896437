"""CPU flash backend: torch's private fused CPU SDPA kernels, which return and accept the LSE.

``aten._scaled_dot_product_flash_attention_for_cpu`` gives (out, logsumexp) and its ``_backward``
takes the joint (out, logsumexp), which is exactly the contract. The ops have no varlen path, so we
loop over packed segments; the prefix kind uses an additive float mask (rows that see nothing are
left out and reported as out = 0, lse = -inf). GQA: the kernels take fewer K/V heads than query
heads and return dK/dV per K/V head (torch 2.13; ``native_gqa()`` probes it once); where they do
not, K/V are repeated per segment and the gradients summed back. Inputs go in as [1, heads, L, D]
views of the THD rows, no copies. fp32 and fp64. Private aten ops: verified on torch 2.13 CPU;
``available()`` probes them.

    from kernels.attention.backends.sdpa_cpu import SdpaCpuBackend
"""
from __future__ import annotations

import torch

from kernels.attention.backends.base import Backend, acc_dtype
from kernels.attention.spec import MaskSpec


def available() -> bool:
    return hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu") and hasattr(
        torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward")


_NATIVE_GQA: list[bool] = []


def native_gqa() -> bool:
    """Whether the fused CPU kernels accept K/V with fewer heads than q (fwd and bwd); probed once."""
    if not _NATIVE_GQA:
        try:
            q, kv = torch.randn(1, 2, 3, 4), torch.randn(1, 1, 3, 4)
            o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, kv, kv, 0.0, True)
            g = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(o, q, kv, kv, o, lse, 0.0, True)
            _NATIVE_GQA.append(tuple(g[1].shape) == tuple(kv.shape) and tuple(g[0].shape) == tuple(q.shape))
        except (RuntimeError, ValueError, TypeError):
            _NATIVE_GQA.append(False)
    return _NATIVE_GQA[0]


def _bhld(x: torch.Tensor, rep: int) -> torch.Tensor:
    x = x.transpose(0, 1)                                # [heads, L, D] view
    if rep > 1:
        x = x.repeat_interleave(rep, dim=0)
    return x.unsqueeze(0)


def _rep(H: int, G: int) -> int:
    """K/V head repeat factor for the kernels: 1 where they take GQA natively."""
    return 1 if H == G or native_gqa() else H // G


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
        ke = spec.key_end[q0:q1]
        rows = torch.nonzero(ke > k0).flatten()
        kj = torch.arange(k0, k1)
        vis = kj.unsqueeze(0) < ke[rows].unsqueeze(1)
        mask = torch.zeros(vis.shape, dtype=dtype).masked_fill_(~vis, float("-inf"))
        return rows, mask, False

    def forward(self, q, k, v, spec, scale):
        T, H, D = q.shape
        rep = _rep(H, k.shape[1])
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
        acc = acc_dtype(q.dtype)
        dq, dk, dv = (torch.zeros(x.shape, dtype=acc) for x in (q, k, v))
        self.backward_into(dout, q, k, v, out, lse, spec, scale, dq, dk, dv)
        return dq, dk, dv

    def backward_into(self, dout, q, k, v, out, lse, spec, scale, dq, dk, dv) -> None:
        """Each segment's gradients are added into its rows of dq, dk, dv (acc dtype) as they come."""
        _T, H, D = q.shape
        G = k.shape[1]
        rep = _rep(H, G)
        acc = acc_dtype(q.dtype)
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
                _bhld(sel(lse_safe), 1), 0.0, causal, attn_mask=mask, scale=scale)
            gq = g[0][0].transpose(0, 1).to(acc)
            gk, gv = (x[0] if rep == 1 else x[0].view(G, rep, k1 - k0, D).sum(1) for x in g[1:])
            gk, gv = gk.transpose(0, 1).to(acc), gv.transpose(0, 1).to(acc)
            if rows is None:
                dq[q0:q1] += gq
            else:
                dq[q0:q1].index_add_(0, rows, gq)
            dk[k0:k1] += gk
            dv[k0:k1] += gv
