"""Host-to-device copies of small index tensors that do not make the host wait for the device.

A copy from pageable host memory to a CUDA device waits for everything queued on the stream before it, so
each one inside a step turns host and device work from overlapped into serial. Through pinned memory the copy
is queued like a kernel (the caching host allocator keeps the pinned block until the copy has run).

    idx_d = to_device(idx, q.device)            # idx: a CPU tensor; any device, any dtype
"""
from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t`` on ``device`` (and in ``dtype``); CPU to CUDA goes through pinned memory, asynchronously."""
    device, dtype = torch.device(device), dtype or t.dtype
    if t.device.type == "cpu" and device.type == "cuda":
        return t.to(dtype).pin_memory().to(device, non_blocking=True)
    return t.to(device, dtype)
