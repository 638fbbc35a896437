"""A candidate few-row product for batch-1 verify steps: ``y = x @ w.T + b`` for 2-8 rows on the CUDA cores.

``repro.decoding.gemv_triton._rows_kernel`` pads a verify step's k + 1 rows to a 16-row tensor-core tile and takes at
least 16 output columns a program, so a narrow projection (1024 columns) runs in 64 programs; in a profile of the
h200 policy's verify step on one H100 its calls took 7.2 us against the one-row kernel's 5.6 us (a verify step 1.28x
a decode step). Here each program owns ``BLOCK_N`` columns (as few as the one-row kernel's 4, so as many programs)
and multiplies every row by each weight tile it streams with plain multiply-adds: per weight element ``BLOCK_M``
(the rows rounded up to a power of two) multiply-adds, still far below what the weight's read takes. Gated as the
op's kernels are (``GATED``: gate rows over up rows, ``silu(gate) * up`` rounded as the separate products would be).
``gemv_configs.py --fma`` times it against the tensor-core kernel and the one-row kernel; it becomes the op's path
only if it wins there.

    launch_fma(x, w, bias, y, block_n=4, block_k=256, num_warps=4)      # x [M, K] (M <= 8), w [N, K], y [M, N]
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from repro.decoding.gemv_triton import _silu_gate, launch_rows

MAX_FMA_ROWS = 8


@triton.jit
def _rows_fma_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                     HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GATED: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    n_ok, m_ok = offs_n < N, offs_m < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0, eviction_policy="evict_first").to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
        if GATED:                                      # the up rows sit N rows below the gate rows
            u = tl.load(w_ptr + (offs_n[:, None] + N) * stride_wn + offs_k[None, :],
                        mask=n_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy="evict_first").to(tl.float32)
            acc_up += tl.sum(x[:, None, :] * u[None, :, :], axis=2)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        acc = _silu_gate(acc, acc_up, y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def launch_fma(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor, *, block_n: int,
               block_k: int, num_warps: int, num_stages: int = 3, gated: bool = False) -> torch.Tensor:
    """Run the kernel into ``y`` ``[M, N]`` for ``x`` ``[M, K]`` of 1 to ``MAX_FMA_ROWS`` unit-strided rows (the
    op's few-row launch with this kernel, the rows rounded up to a power of two); ``gated``: ``w`` is ``[2N, K]``
    and ``y`` gets ``silu(gate) * up``."""
    m = x.shape[0]
    if not 1 <= m <= MAX_FMA_ROWS:
        raise ValueError(f"launch_fma takes 1 to {MAX_FMA_ROWS} rows, got x of shape {tuple(x.shape)}")
    return launch_rows(x, w, bias, y, block_m=triton.next_power_of_2(m), block_n=block_n, block_k=block_k,
                       num_warps=num_warps, num_stages=num_stages, kernel=_rows_fma_kernel, gated=gated)
