"""The attention backends' names, importable without torch.

A profile names its drafts' attention backend (``options.attn_backend``) and is validated wherever it is read,
the workflow's parse included; this module lets that check name the backends without importing torch and the
kernels (``kernels.attention.backends`` builds its registry from these names and imports both).
"""
from __future__ import annotations

KERNELS = ("torch", "torch_bf16", "sdpa_cpu", "sdpa_cuda", "cudnn", "flex", "flash_attn", "flash4")
WRAPPED = ("torch", "sdpa_cpu", "sdpa_cuda", "cudnn", "flash_attn", "flash4")   # kernels the wrappers take
PREFIX_FULL_MERGES = {"": "auto", ":torch_fold": "torch"}                      # name suffix -> replica merge


def prefix_full(kernel: str, suffix: str = "") -> str:
    return f"prefix_full[{kernel}]{suffix}"


def tiled(kernel: str) -> str:
    return f"tiled[{kernel}]"


NAMES = ("auto", *KERNELS, *(prefix_full(n, s) for n in WRAPPED for s in PREFIX_FULL_MERGES),
         *(tiled(n) for n in WRAPPED))
