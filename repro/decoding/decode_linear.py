"""The projections of a decode step: one row on a GPU goes to the Triton matrix-vector kernel, anything else to
``F.linear``.

``decode_linear(x, w, b)`` is ``F.linear(x, w, b)``; where ``x`` holds one row (a batch-1 decode step), lives on a
CUDA device in a floating dtype other than fp64 and the weight is row-major, it runs ``torch.ops.repro.gemv``
(``repro.decoding.gemv_triton``), which reads the weight near the copy rate where cuBLAS's one-row kernels do not.
Where Triton does not import, or on a CPU, every call is ``F.linear``. ``DecodeLinear`` is the ``nn.Linear``
subclass the decode block (``repro.decoding.merged_projections``) gives a layer's other projections.

    y = decode_linear(x, layer.o_proj.weight, layer.o_proj.bias)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

try:
    from repro.decoding import gemv_triton
except ImportError:          # no Triton here: F.linear everywhere
    gemv_triton = None

GEMV_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def uses_gemv(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``decode_linear(x, w)`` runs the Triton kernel (a rule on shapes and devices, fixed for a graph)."""
    return (gemv_triton is not None and x.is_cuda and x.dtype in GEMV_DTYPES and w.dtype == x.dtype
            and x.numel() == x.shape[-1] and w.dim() == 2 and w.stride(1) == 1)


def one_row_product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` ``[1, K]`` times ``w.T`` on the Triton kernel (a test replaces this with a stand-in)."""
    return torch.ops.repro.gemv(x, w, bias)


def decode_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if not uses_gemv(x, w):
        return F.linear(x, w, bias)
    return one_row_product(x.reshape(1, -1).contiguous(), w, bias).view(*x.shape[:-1], w.shape[0])


class DecodeLinear(nn.Linear):
    """An ``nn.Linear`` whose product is ``decode_linear`` (the class a projection has inside the decode block)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return decode_linear(x, self.weight, self.bias)
