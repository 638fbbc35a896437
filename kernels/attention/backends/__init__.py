"""Attention backends and their selection.

    backend = select("auto", spec, device, dtype)      # or a name: "torch", "sdpa_cpu", "sdpa_cuda"
    out, lse = backend.forward(q, k, v, spec, scale)

``auto`` picks, per mask kind: CUDA -> sdpa_cuda (flash: causal/full; prefix through
prefix_full[sdpa_cuda], replicated query rows) else torch; CPU -> sdpa_cpu (fp32/fp64) else torch.
``"torch"`` is the pure-torch oracle kernel. ``"cudnn"`` (torch's cuDNN attention, one call per
packed segment) is opt-in by name.
flash-attn (the external package) and flex_attention are probed, never imported unconditionally;
they are not wired as backends in this version (see the issue report).
"""
from __future__ import annotations

import torch

from kernels.attention.backends.base import Backend, acc_dtype, check_qkv
from kernels.attention.backends.cudnn import CudnnBackend
from kernels.attention.backends.prefix_full import PrefixAsFull
from kernels.attention.backends.sdpa_cpu import SdpaCpuBackend
from kernels.attention.backends.sdpa_cuda import SdpaCudaBackend
from kernels.attention.backends.tiled import TiledBackward
from kernels.attention.backends.torch_ref import TorchBackend
from kernels.attention.spec import MaskSpec

_REGISTRY: dict[str, Backend] = {
    "torch": TorchBackend(),
    "torch_bf16": TorchBackend(compute_dtype=torch.bfloat16),
    "sdpa_cpu": SdpaCpuBackend(),
    "sdpa_cuda": SdpaCudaBackend(),
    "cudnn": CudnnBackend(),
}
_REGISTRY.update({f"prefix_full[{n}]": PrefixAsFull(_REGISTRY[n])
                  for n in ("torch", "sdpa_cpu", "sdpa_cuda", "cudnn")})
_REGISTRY.update({f"tiled[{n}]": TiledBackward(_REGISTRY[n]) for n in ("torch", "sdpa_cpu", "sdpa_cuda", "cudnn")})
NAMES = ("auto", *_REGISTRY)


def get(name: str) -> Backend:
    if name not in _REGISTRY:
        raise ValueError(f"unknown attention backend {name!r}; expected one of {NAMES}")
    return _REGISTRY[name]


def select(name: str | Backend, spec: MaskSpec, device: torch.device, dtype: torch.dtype) -> Backend:
    """The backend to run ``spec`` on; a named backend that cannot run the case raises ValueError."""
    if isinstance(name, Backend):
        return name
    if name != "auto":
        b = get(name)
        if not b.supports(spec, device, dtype):
            raise ValueError(f"backend {name!r} cannot run mask kind {spec.kind!r} on {device.type} "
                             f"with {dtype}")
        return b
    order = (["sdpa_cuda", "prefix_full[sdpa_cuda]",
              "torch_bf16" if dtype in (torch.bfloat16, torch.float16) else "torch"]
             if device.type == "cuda" else ["sdpa_cpu", "torch"])
    for n in order:
        if _REGISTRY[n].supports(spec, device, dtype):
            return _REGISTRY[n]
    raise ValueError(f"no backend for {spec.kind!r} on {device.type} with {dtype}")


__all__ = ["NAMES", "Backend", "MaskSpec", "acc_dtype", "check_qkv", "get", "select"]
