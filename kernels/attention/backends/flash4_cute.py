"""CuTe-DSL mask functions for flash-attn-4 (``mask_mod``); their torch twins and data layout: flash4_masks.py.

Imports the CUTLASS DSL at module load, so only flash4_masks.cute_mask imports this module, on machines where
``flash_attn.cute`` imports. The kernel calls a mask function per score element with size-1 Int32 SSA values
(batch, head, q_idx, kv_idx), its SeqlenInfo and the aux tensors, and keeps the score where it returns True.
q_idx can run past seqlen_q in a query tile's padding rows (those results are discarded), so row reads are
clamped into the batch row's range, as flash-attention's own aux-reading mask examples do.
"""
from __future__ import annotations

import cutlass
from cutlass import cute
from flash_attn.cute import utils


@cute.jit
def _read(aux: cute.Tensor, idx_ssa: cute.TensorSSA, first, last) -> cute.TensorSSA:
    """aux[clamp(idx, first, last)] as a size-1 Int32 SSA value."""
    idx = cute.make_rmem_tensor(1, cutlass.Int32)
    idx.store(idx_ssa)
    val = cute.make_rmem_tensor(1, cutlass.Int32)
    val[0] = aux[cutlass.max(cutlass.min(idx[0], last), first)]
    return val.load()


@cute.jit
def _row(aux: cute.Tensor, batch: cute.TensorSSA, q_idx: cute.TensorSSA, seqlen_info) -> cute.TensorSSA:
    base = batch[0] * seqlen_info.seqlen_q
    flat = q_idx + utils.scalar_to_ssa(base, cutlass.Int32)
    return _read(aux, flat, base, base + seqlen_info.seqlen_q - 1)


@cute.jit
def interval_mask(batch: cute.TensorSSA, head: cute.TensorSSA, q_idx: cute.TensorSSA, kv_idx: cute.TensorSSA,
                  seqlen_info, aux_tensors) -> cute.TensorSSA:
    """aux: lo, hi ([R * Sq] int32). Keeps lo[r, m] <= n < hi[r, m]."""
    lo = _row(aux_tensors[0], batch, q_idx, seqlen_info)
    hi = _row(aux_tensors[1], batch, q_idx, seqlen_info)
    return (kv_idx >= lo) & (kv_idx < hi)


@cute.jit
def block_mask(batch: cute.TensorSSA, head: cute.TensorSSA, q_idx: cute.TensorSSA, kv_idx: cute.TensorSSA,
               seqlen_info, aux_tensors) -> cute.TensorSSA:
    """aux: lo1, hi1, lo2, hi2 ([R * Sq] int32), key_ok ([R * Sk] int32). Keeps the first interval, and the
    second where the key is valid."""
    lo1 = _row(aux_tensors[0], batch, q_idx, seqlen_info)
    hi1 = _row(aux_tensors[1], batch, q_idx, seqlen_info)
    lo2 = _row(aux_tensors[2], batch, q_idx, seqlen_info)
    hi2 = _row(aux_tensors[3], batch, q_idx, seqlen_info)
    kbase = batch[0] * seqlen_info.seqlen_k
    kflat = kv_idx + utils.scalar_to_ssa(kbase, cutlass.Int32)
    ok = _read(aux_tensors[4], kflat, kbase, kbase + seqlen_info.seqlen_k - 1)
    zero = utils.scalar_to_ssa(0, cutlass.Int32)
    return ((kv_idx >= lo1) & (kv_idx < hi1)) | ((kv_idx >= lo2) & (kv_idx < hi2) & (ok != zero))
