"""Index tensors the varlen flash kernels need, derived once per MaskSpec and cached on it.

    cu_q, cu_k, max_q, max_k = varlen_bounds(spec, device)   # int32 boundaries + longest segments
    seg, off = padded_index(spec, device)                    # packed row -> (segment, offset)
    rows = padded_lse_rows(lse, spec)                        # padded kernel LSE -> [T, H]
    lse = lse_to_kernel(rows, spec, layout, max_q)           # and back

Both torch's bundled flash kernels (sdpa_cuda) and the external flash-attn package (flash_attn) take
int32 cu_seqlens and the longest segment, and some builds return the LSE padded per segment.
"""
from __future__ import annotations

import torch

from kernels.attention.spec import MaskSpec
from kernels.attention.staging import to_device


def varlen_bounds(spec: MaskSpec, device):
    """(cu_q int32, cu_k int32, longest query segment, longest key segment) on ``device``."""
    key = ("varlen_bounds", str(device))
    if key not in spec._cache:
        lq, lk = spec.cu_q.diff(), spec.cu_k.diff()
        spec._cache[key] = (to_device(spec.cu_q, device, torch.int32), to_device(spec.cu_k, device, torch.int32),
                            int(lq.max()) if lq.numel() else 0, int(lk.max()) if lk.numel() else 0)
    return spec._cache[key]


def padded_index(spec: MaskSpec, device):
    """(segment, offset in segment) of every packed query row: the ``[B, H, max_q]`` LSE layout's index."""
    key = ("padded_index", str(device))
    if key not in spec._cache:
        lq = spec.cu_q.diff()
        seg = torch.repeat_interleave(torch.arange(lq.numel()), lq)
        spec._cache[key] = (to_device(seg, device), to_device(torch.arange(spec.num_q) - spec.cu_q[seg], device))
    return spec._cache[key]


def padded_lse_rows(lse: torch.Tensor, spec: MaskSpec) -> torch.Tensor:
    """A padded ``[B, H, max_q]`` kernel LSE -> ``[total_q, H]`` rows."""
    seg, off = padded_index(spec, lse.device)
    return lse[seg, :, off]


def lse_to_kernel(rows: torch.Tensor, spec: MaskSpec, layout: str, max_q: int) -> torch.Tensor:
    """``[total_q, H]`` rows -> the kernel's LSE layout: ``[H, total_q]`` ("packed") or ``[B, H, max_q]``
    ("padded", padding entries +inf, never read)."""
    if layout == "packed":
        return rows.transpose(0, 1).contiguous()
    seg, off = padded_index(spec, rows.device)
    out = torch.full((spec.cu_q.numel() - 1, rows.shape[1], max_q), float("inf"), dtype=rows.dtype,
                     device=rows.device)
    out[seg, :, off] = rows
    return out
