"""Which of torch's SDPA kernels the HF policy and the drafts may use on CUDA: everything but cuDNN.

cuDNN's fused attention builds an execution plan for every new (query length, key length) shape.
Decoding changes the key length at every step (speculative decoding also the query length) and every
rollout batch gives the update new sequence lengths, so on an H200 that set-up cost ~0.85 ms of host
time per attention call with plain decoding, ~7 ms with a draft, and 2-3 s per update on the first
steps. Flash and memory-efficient attention take the same inputs with no per-shape set-up. On CPU nothing
changes.

    with no_cudnn_sdpa(device):
        model(...)
"""
from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def no_cudnn_sdpa(device: torch.device | str):
    """A context that lets SDPA pick flash, memory-efficient or math kernels (not cuDNN) on CUDA."""
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
