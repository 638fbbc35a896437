"""The projections of a decode step: a few rows on a GPU go to the Triton matrix-vector kernels, anything else to
``F.linear``.

``decode_linear(x, w, b)`` is ``F.linear(x, w, b)``; where ``x`` holds one row (a batch-1 decode step; fp32, bf16
or fp16) or at most ``MAX_ROWS`` rows in bf16/fp16 (a batch-1 verify step over k + 1 tokens), lives on a CUDA
device, the weight is row-major and no gradient is asked for, it runs ``torch.ops.repro.gemv``
(``repro.decoding.gemv_triton``), which reads the weight once near the copy rate where cuBLAS's few-row kernels do
not.
Where Triton does not import, or on a CPU, every call is ``F.linear``. ``DecodeLinear`` is the ``nn.Linear``
subclass the decode block (``repro.decoding.merged_projections``) gives a layer's other projections.
``silu_gated(x, w)`` is a gated MLP's ``silu(x @ gate.T) * (x @ up.T)`` over its stacked ``[gate; up]`` weight: one
kernel (``torch.ops.repro.gemv_silu_mul``) under the same rule, else one ``F.linear`` and the gate.

    y = decode_linear(x, layer.o_proj.weight, layer.o_proj.bias)
    h = silu_gated(x, torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]))
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

try:
    from repro.decoding import gemv_triton
except ImportError:          # no Triton here: F.linear everywhere
    gemv_triton = None

MAX_ROWS = 16                # gemv_triton.MAX_ROWS, known without Triton
GEMV_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ROWS_DTYPES = (torch.bfloat16, torch.float16)       # several rows: tensor cores (fp32 would round to tf32)


def uses_gemv(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``decode_linear(x, w)`` runs the Triton kernel (a rule on shapes and devices, fixed for a graph)."""
    rows = x.numel() // max(1, x.shape[-1])
    return (gemv_triton is not None and x.is_cuda and x.dtype in GEMV_DTYPES and w.dtype == x.dtype
            and (rows == 1 or (1 < rows <= MAX_ROWS and x.dtype in ROWS_DTYPES)) and w.dim() == 2
            and w.stride(1) == 1
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)))   # the op has no backward


def few_row_product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` ``[M, K]`` (``M <= MAX_ROWS``) times ``w.T`` on the Triton kernels (a test replaces this with a
    stand-in)."""
    return torch.ops.repro.gemv(x, w, bias)


def gated_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``silu(x @ w[:N].T) * (x @ w[N:].T)`` for ``x`` ``[M, K]`` (``M <= MAX_ROWS``) on the Triton kernel (a test
    replaces this with a stand-in)."""
    return torch.ops.repro.gemv_silu_mul(x, w)


def decode_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if not uses_gemv(x, w):
        return F.linear(x, w, bias)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return few_row_product(rows, w, bias).view(*x.shape[:-1], w.shape[0])


def silu_gated(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``silu(x @ w[:N].T) * (x @ w[N:].T)`` for a gated MLP's stacked ``w`` ``[2N, K]`` (gate rows over up rows)."""
    n = w.shape[0] // 2
    if not uses_gemv(x, w):
        gate, up = F.linear(x, w).split(n, dim=-1)
        return F.silu(gate) * up
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return gated_product(rows, w).view(*x.shape[:-1], n)


class DecodeLinear(nn.Linear):
    """An ``nn.Linear`` whose product is ``decode_linear`` (the class a projection has inside the decode block)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return decode_linear(x, self.weight, self.bias)
