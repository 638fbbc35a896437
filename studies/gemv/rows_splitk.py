"""A candidate few-row product for the narrow projections of a batch-1 verify step: ``y = x @ w.T + b`` with the
inner dimension split over ``SPLIT_K`` programs, reduced inside the same kernel.

``repro.decoding.gemv_triton._rows_kernel`` takes at least 16 output columns a program (the tensor cores' least
tile), so a 1024-column projection (the h200 policy's o and down) runs in 64 programs on an H100's 132 SMs; in
studies/gemv_fma.txt of the h100 reference its calls at 2-8 rows took 4.5 us (o) and 5.7 us (down) against the
one-row kernel's 3.0 and 4.0. Here program (n, s) multiplies the rows by its columns' weight over the s-th slice of
the inner dimension, so there are ``SPLIT_K`` times as many programs, and writes its fp32 partial to a workspace.
Each column block has a counter: the program that brings it to ``SPLIT_K`` sums the partials in slice order (the same
order every call: the result does not depend on which program arrives last), adds the bias, stores the output and
sets the counter back to zero, so one zeroed counter buffer serves every later call with no memset of its own.
``gemv_configs.py --splitk`` times it against the op; it becomes the op's path only if it wins there.

    lock = torch.zeros(LOCK_SLOTS, dtype=torch.int32, device="cuda")       # once; every call leaves it zeroed
    launch_splitk(x, w, bias, y, lock, block_n=16, block_k=256, split_k=4, num_warps=4)   # x [M, K], M <= 16
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

LOCK_SLOTS = 4096          # column blocks one counter buffer serves (a 65536-column product at 16 columns a block)


@triton.jit
def _rows_splitk_kernel(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, lock_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        SPLIT_K: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    n_ok, m_ok = offs_n < N, offs_m < M
    k_span = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K          # whole tiles a slice
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(pid_k * k_span, tl.minimum((pid_k + 1) * k_span, K), BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0)
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0, eviction_policy="evict_first")
        acc = tl.dot(x, tl.trans(w), acc)
    # the workspace is [SPLIT_K, BLOCK_M, N] fp32; padded rows are stored too (zeros), so no row mask is needed
    part = part_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.store(part + pid_k * BLOCK_M * N, acc, mask=n_ok[None, :])
    arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel")      # releases this partial, acquires the others'
    if arrived == SPLIT_K - 1:
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in range(SPLIT_K):
            total += tl.load(part + s * BLOCK_M * N, mask=n_ok[None, :], other=0.0, cache_modifier=".cg")
        if HAS_BIAS:
            total += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], total.to(y_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])
        tl.atomic_xchg(lock_ptr + pid_n, 0)                            # ready for the next call


def launch_splitk(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor, lock: torch.Tensor,
                  *, block_n: int, block_k: int, split_k: int, num_warps: int, num_stages: int = 3) -> torch.Tensor:
    """Run the kernel into ``y`` ``[M, N]`` for ``x`` ``[M, K]`` (1 to 16 unit-strided rows); ``lock``: an int32
    buffer of at least ``cdiv(N, block_n)`` zeros, left zeroed."""
    m, k = x.shape
    n = w.shape[0]
    if not 1 <= m <= 16:
        raise ValueError(f"launch_splitk takes 1 to 16 rows, got x of shape {tuple(x.shape)}")
    blocks = triton.cdiv(n, block_n)
    if lock.dtype != torch.int32 or lock.numel() < blocks:
        raise ValueError(f"launch_splitk needs an int32 lock of at least {blocks} slots, got {lock.dtype} "
                         f"of {lock.numel()}")
    part = torch.empty(split_k, 16, n, dtype=torch.float32, device=x.device)
    _rows_splitk_kernel[(blocks, split_k)](x, w, bias if bias is not None else w, y, part, lock, m, n, k,
                                           x.stride(0), w.stride(0), y.stride(0), HAS_BIAS=bias is not None,
                                           BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k,
                                           num_warps=num_warps, num_stages=num_stages)
    return y
