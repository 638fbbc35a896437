"""The backend contract every attention kernel honours (see kernels/attention/spec.py for masks).

    out, lse = backend.forward(q, k, v, spec, scale)
        q [Tq, H, D], k/v [Tk, G, D] (G divides H), spec: MaskSpec.
        out [Tq, H, D] in q's dtype; lse [Tq, H] in acc_dtype(q) (fp32, or fp64 for fp64 inputs).
        Rows that see no key: out = 0, lse = -inf.
    dq, dk, dv = backend.backward(dout, q, k, v, out, lse, spec, scale)
        ``out``/``lse`` are the *joint* values (after merging every key block), so the result is this
        block's exact share of the gradient of the joint softmax. Gradients come back in acc_dtype(q)
        or in q's dtype (flash kernels); ring steps accumulate them in acc_dtype(q) buffers. Rows whose
        joint lse is -inf get zero gradient.
    backend.backward_into(dout, q, k, v, out, lse, spec, scale, dq, dk, dv)
        The same gradients added into the caller's accumulators (the ring's); by default backward +
        add, overridden where a kernel's per-segment results can go straight in (no zeroed buffers).

``supports(spec, device, dtype)`` says whether a backend can run a case; ``select`` in
``backends/__init__.py`` picks one.
"""
from __future__ import annotations

import torch

from kernels.attention.spec import MaskSpec


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: MaskSpec | None = None) -> None:
    """Shapes and dtypes of one block call; raises ValueError/TypeError naming the bad value."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [T, heads, D], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.is_floating_point():
        raise TypeError(f"q, k, v must be floating-point tensors, got {q.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"head dim of q ({q.shape[-1]}) and k ({k.shape[-1]}) differ")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"query heads H={q.shape[1]} must be a multiple of key/value heads G={k.shape[1]}")
    if spec is not None and (spec.num_q != q.shape[0] or spec.num_k != k.shape[0]):
        raise ValueError(f"MaskSpec covers {spec.num_q} queries x {spec.num_k} keys, tensors have "
                         f"{q.shape[0]} x {k.shape[0]}")


class Backend:
    name = "base"

    def supports(self, spec: MaskSpec, device: torch.device, dtype: torch.dtype) -> bool:
        raise NotImplementedError

    def unavailable_reason(self, spec: MaskSpec, device: torch.device, dtype: torch.dtype) -> str | None:
        """Why ``supports`` is False (for error messages); None where it is True or no reason is known."""
        return None

    def forward(self, q, k, v, spec: MaskSpec, scale: float):
        raise NotImplementedError

    def backward(self, dout, q, k, v, out, lse, spec: MaskSpec, scale: float):
        raise NotImplementedError

    def backward_into(self, dout, q, k, v, out, lse, spec: MaskSpec, scale: float, dq, dk, dv) -> None:
        gq, gk, gv = self.backward(dout, q, k, v, out, lse, spec, scale)
        dq += gq
        dk += gk
        dv += gv
