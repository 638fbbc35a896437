"""Triton products for decode steps: ``y = x @ w.T + b`` for one row ``x`` (a batch-1 decode step) or a few rows (a
batch-1 verify step over k + 1 tokens). Imports only where Triton does; ``repro.decoding.decode_linear`` decides when
to use them.

At batch 1 a decoder layer's projections stream their weights once per token; cuBLAS's kernels for one row reach
a quarter to a half of an H200's copy bandwidth on the h200 policy's 1024-wide layers, and its split-K
kernels add a second launch. Here each program owns ``BLOCK_N`` output columns over the whole inner dimension, so
the weight is read once in ``BLOCK_K``-wide tiles, the partial sums stay in registers, and there is one kernel. Two
to ``MAX_ROWS`` rows (bf16 or fp16) share each weight tile on the tensor cores (``_rows_kernel``, the rows padded to
16): the product of a few rows is as weight-bound as one row's. A gated MLP's gate and up products and its
``silu(gate) * up`` run as one kernel (``GATED``: each program streams the gate rows and the up rows of its columns),
so the gate costs no launch of its own. Registered as the custom ops ``torch.ops.repro.gemv`` and ``gemv_silu_mul``
(``torch.library.triton_op``), so inductor compiles them into a decoder layer and CUDA graphs capture them like any
op.

    y = torch.ops.repro.gemv(x, w, bias)      # x [M, K] (M <= MAX_ROWS), w [N, K] row-major, bias [N] or None
    h = torch.ops.repro.gemv_silu_mul(x, w)   # w [2N, K]: silu(x @ gate.T) * (x @ up.T), h [M, N]
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


@triton.jit
def _silu_gate(gate, up, io_dtype: tl.constexpr):
    """silu(gate) * up on the products as the separate kernels would hand them over (rounded to the IO dtype)."""
    gate = gate.to(io_dtype).to(tl.float32)
    return gate * tl.sigmoid(gate) * up.to(io_dtype).to(tl.float32)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_wn,
                 HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GATED: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        x = tl.load(x_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0, eviction_policy="evict_first")
        acc += tl.sum(w.to(tl.float32) * x, axis=1)
        if GATED:                                      # the up rows sit N rows below the gate rows
            u = tl.load(w_ptr + (offs_n[:, None] + N) * stride_wn + offs_k[None, :],
                        mask=n_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy="evict_first")
            acc_up += tl.sum(u.to(tl.float32) * x, axis=1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    if GATED:
        acc = _silu_gate(acc, acc_up, y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs_n, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _rows_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
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
                    other=0.0)
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0, eviction_policy="evict_first")
        acc = tl.dot(x, tl.trans(w), acc)              # the rows padded to the tensor cores' 16
        if GATED:
            u = tl.load(w_ptr + (offs_n[:, None] + N) * stride_wn + offs_k[None, :],
                        mask=n_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy="evict_first")
            acc_up = tl.dot(x, tl.trans(u), acc_up)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        acc = _silu_gate(acc, acc_up, y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


MAX_ROWS = 16


def tiles(k: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps) from one H200 sweep of 24 configs (studies/gemv/gemv_configs.py): four output
    columns a program in 1024-wide tiles was the best config for one row on the o, down, gate_up and head shapes
    of the h200 policy (8 warps, 4 on gate_up); q/k/v's best had eight columns."""
    return 4, min(1024, triton.next_power_of_2(k)), 8


def row_tiles(m: int, n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) for ``m`` rows of an ``[n, k]`` weight, the rows padded to 16 (a
    tensor-core tile). From one H200 sweep of 24 configs at 5 and 16 rows (studies/gemv/gemv_configs.py): wide
    outputs (q/k/v, gate/up: 4096 and 6144 columns) were best at 32 columns a program in 128-wide inner tiles, on a
    par with cuBLAS; narrow ones (o, down, the head) at 16 columns in 512-wide tiles, which keeps enough programs
    in flight, 1.1-1.7x faster than cuBLAS."""
    block_n, block_k = (32, 128) if n >= 4096 else (16, 512)
    return max(16, triton.next_power_of_2(m)), block_n, min(block_k, max(16, triton.next_power_of_2(k))), 4


def launch(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor, *, block_n: int,
           block_k: int, num_warps: int, num_stages: int = 3, kernel=_gemv_kernel, gated: bool = False) -> torch.Tensor:
    """Run the one-row kernel into ``y`` ``[1, N]`` with the given tiles (the ops below, and the sweep's configs);
    ``gated``: ``w`` is ``[2N, K]``, gate rows over up rows, and ``y`` gets ``silu(gate) * up``."""
    n, k = w.shape
    n = n // 2 if gated else n
    kernel[(triton.cdiv(n, block_n),)](x, w, bias if bias is not None else w, y, n, k, w.stride(0),
                                       HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k, GATED=gated,
                                       num_warps=num_warps, num_stages=num_stages)
    return y


def launch_rows(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor, *, block_m: int,
                block_n: int, block_k: int, num_warps: int, num_stages: int = 3, kernel=_rows_kernel,
                gated: bool = False) -> torch.Tensor:
    """Run the few-rows kernel into ``y`` ``[M, N]`` (``M <= block_m``; rows of ``x`` and ``y`` unit-strided);
    ``gated`` as in ``launch``."""
    n, k = w.shape
    n = n // 2 if gated else n
    kernel[(triton.cdiv(n, block_n),)](x, w, bias if bias is not None else w, y, x.shape[0], n, k, x.stride(0),
                                       w.stride(0), y.stride(0), HAS_BIAS=bias is not None, BLOCK_M=block_m,
                                       BLOCK_N=block_n, BLOCK_K=block_k, GATED=gated, num_warps=num_warps,
                                       num_stages=num_stages)
    return y


def _check_rows(x: torch.Tensor, op: str) -> None:
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"repro::{op} takes 1 to {MAX_ROWS} rows, got x of shape {tuple(x.shape)}")


def _product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, gated: bool) -> torch.Tensor:
    """The op's launch. Gated, a program takes half the columns the plain product over the stacked ``w`` would
    give it, gate and up rows of each: the same programs, each streaming as many weight rows per tile (in a profile
    of a decode step on one H200, the gated kernel with the plain product's column count per program, so half the
    programs, took well over the plain product's time at one row)."""
    m, k = x.shape
    y = torch.empty(m, w.shape[0] // 2 if gated else w.shape[0], dtype=x.dtype, device=x.device)
    if m == 1:
        block_n, block_k, warps = tiles(k)
        block_n = max(1, block_n // 2) if gated else block_n
        return launch(x, w, bias, y, block_n=block_n, block_k=block_k, num_warps=warps,
                      kernel=wrap_triton(_gemv_kernel), gated=gated)
    block_m, block_n, block_k, warps = row_tiles(m, w.shape[0], k)
    block_n = max(16, block_n // 2) if gated else block_n           # 16: the tensor cores' least tile
    return launch_rows(x, w, bias, y, block_m=block_m, block_n=block_n, block_k=block_k, num_warps=warps,
                       kernel=wrap_triton(_rows_kernel), gated=gated)


@triton_op("repro::gemv", mutates_args=())
def gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, bias)`` for a contiguous ``x`` ``[M, K]`` of at most ``MAX_ROWS`` rows and a row-major
    ``w`` ``[N, K]``."""
    _check_rows(x, "gemv")
    return _product(x, w, bias, gated=False)


@triton_op("repro::gemv_silu_mul", mutates_args=())
def gemv_silu_mul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``silu(x @ w[:N].T) * (x @ w[N:].T)`` for a contiguous ``x`` ``[M, K]`` of at most ``MAX_ROWS`` rows and a
    row-major ``w`` ``[2N, K]`` (a gated MLP's stacked gate and up weights): its products and gate in one kernel."""
    _check_rows(x, "gemv_silu_mul")
    if w.shape[0] % 2:
        raise ValueError(f"repro::gemv_silu_mul takes gate rows over as many up rows, got w of shape {tuple(w.shape)}")
    return _product(x, w, None, gated=True)
