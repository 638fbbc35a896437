"""GPU flash backend: the flash-attention kernels bundled in torch (``aten._flash_attention_*``).

Varlen (packed THD) forward returning the LSE, and a backward that accepts the joint (out, lse),
for the "causal" and "full" mask kinds (fp16/bf16, CUDA). GQA is native (no K/V repeat). The
bundled FA2 reports rows without keys as lse = +inf; we normalise that to the contract's -inf, and
hand -inf back to the kernel as +inf so such rows get P = 0. Prefix masks go to another backend.

    from kernels.attention.backends.sdpa_cuda import SdpaCudaBackend
"""
from __future__ import annotations

import torch

from kernels.attention.backends.base import Backend, acc_dtype
from kernels.attention.backends.varlen_index import lse_to_kernel, padded_lse_rows, varlen_bounds
from kernels.attention.spec import MaskSpec


def available() -> bool:
    return torch.cuda.is_available() and hasattr(torch.ops.aten, "_flash_attention_forward")


def _lse_rows(lse: torch.Tensor, spec: MaskSpec, H: int) -> torch.Tensor:
    """Kernel LSE ([H, total_q] packed, or [B, H, max_q] padded in older builds) -> [total_q, H]."""
    if lse.dim() == 2 and lse.shape[0] == H:
        return lse.transpose(0, 1)
    if lse.dim() == 3 and lse.shape[1] == H:
        return padded_lse_rows(lse, spec)
    raise RuntimeError(f"unexpected flash LSE shape {tuple(lse.shape)} for {H} heads")


class SdpaCudaBackend(Backend):
    name = "sdpa_cuda"

    def __init__(self, native_grad_dtype: bool = True):
        # native_grad_dtype: return dq/dk/dv in the input dtype (callers accumulate into fp32 buffers
        # where several ring steps add up; a single-step ring then needs no fp32 copy at all).
        self.native_grad_dtype = native_grad_dtype
        self.gqa_native: bool | None = None      # probed on first GQA call; False -> repeat K/V
        self._rng = None                         # (rng_state, unused) of a forward call, for backward

    def _expand(self, k: torch.Tensor, H: int) -> torch.Tensor:
        return k if (self.gqa_native or k.shape[1] == H) else k.repeat_interleave(H // k.shape[1], dim=1)

    def _fwd(self, q, k, v, cu_q, cu_k, mq, mk, causal, scale):
        return torch.ops.aten._flash_attention_forward(
            q, self._expand(k, q.shape[1]), self._expand(v, q.shape[1]), cu_q, cu_k, mq, mk, 0.0, causal, False,
            scale=scale)

    def supports(self, spec, device, dtype) -> bool:
        return (device.type == "cuda" and spec.kind in ("causal", "full")
                and dtype in (torch.float16, torch.bfloat16) and available())

    def forward(self, q, k, v, spec, scale):
        cu_q, cu_k, mq, mk = varlen_bounds(spec, q.device)
        if mq == 0 or mk == 0:
            return (torch.zeros_like(q),
                    torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device))
        causal = spec.kind == "causal"
        if self.gqa_native is None and k.shape[1] != q.shape[1]:
            try:
                self.gqa_native = True
                res = self._fwd(q, k, v, cu_q, cu_k, mq, mk, causal, scale)
            except RuntimeError:
                self.gqa_native = False
                res = self._fwd(q, k, v, cu_q, cu_k, mq, mk, causal, scale)
        else:
            res = self._fwd(q, k, v, cu_q, cu_k, mq, mk, causal, scale)
        out, lse = res[0], res[1]
        self._rng = (res[2], res[3])
        spec._cache["cuda_lse_layout"] = "padded" if lse.dim() == 3 else "packed"
        lse = _lse_rows(lse, spec, q.shape[1])
        lse = torch.where(torch.isposinf(lse), torch.full_like(lse, float("-inf")), lse)
        return out, lse.float()

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        cu_q, cu_k, mq, mk = varlen_bounds(spec, q.device)
        if mq == 0 or mk == 0:
            z = (torch.zeros(q.shape, dtype=torch.float32, device=q.device),
                 torch.zeros(k.shape, dtype=torch.float32, device=q.device),
                 torch.zeros(v.shape, dtype=torch.float32, device=q.device))
            return z
        lse_k = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
        lse_k = lse_to_kernel(lse_k.float(), spec, spec._cache.get("cuda_lse_layout", "packed"), mq)
        if self._rng is None:      # no dropout: the generator state is never read
            self._rng = (torch.zeros(2, dtype=torch.int64, device=q.device),
                         torch.zeros((), dtype=torch.int64, device=q.device))
        H, G = q.shape[1], k.shape[1]
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout.to(q.dtype).contiguous(), q, self._expand(k, H), self._expand(v, H), out.to(q.dtype).contiguous(),
            lse_k, cu_q, cu_k, mq, mk, 0.0, spec.kind == "causal", self._rng[0], self._rng[1], scale=scale)
        if dk.shape[1] != G:
            dk = dk.view(dk.shape[0], G, H // G, -1).sum(2)
            dv = dv.view(dv.shape[0], G, H // G, -1).sum(2)
        if self.native_grad_dtype:
            return dq, dk, dv
        acc = acc_dtype(q.dtype)
        return dq.to(acc), dk.to(acc), dv.to(acc)
