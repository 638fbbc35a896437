"""Index tensors the varlen flash kernels need, derived once per MaskSpec and cached on it.

    cu_q, cu_k, max_q, max_k = varlen_bounds(spec, device)   # int32 boundaries + longest segments
    seg, off = padded_index(spec, device)                    # packed row -> (segment, offset)

Both torch's bundled flash kernels (sdpa_cuda) and the external flash-attn package (flash_attn) take
int32 cu_seqlens and the longest segment, and some builds return the LSE padded per segment.
"""
from __future__ import annotations

import torch

from kernels.attention.spec import MaskSpec


def varlen_bounds(spec: MaskSpec, device):
    """(cu_q int32, cu_k int32, longest query segment, longest key segment) on ``device``."""
    key = ("varlen_bounds", str(device))
    if key not in spec._cache:
        lq, lk = spec.cu_q.diff(), spec.cu_k.diff()
        spec._cache[key] = (spec.cu_q.to(device, torch.int32), spec.cu_k.to(device, torch.int32),
                            int(lq.max()) if lq.numel() else 0, int(lk.max()) if lk.numel() else 0)
    return spec._cache[key]


def padded_index(spec: MaskSpec, device):
    """(segment, offset in segment) of every packed query row: the ``[B, H, max_q]`` LSE layout's index."""
    key = ("padded_index", str(device))
    if key not in spec._cache:
        lq = spec.cu_q.diff()
        seg = torch.repeat_interleave(torch.arange(lq.numel()), lq)
        spec._cache[key] = (seg.to(device), (torch.arange(spec.num_q) - spec.cu_q[seg]).to(device))
    return spec._cache[key]
