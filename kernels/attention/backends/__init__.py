"""Attention backends and their selection.

    backend = select("auto", spec, device, dtype)      # or a name: "torch", "sdpa_cpu", "sdpa_cuda", ...
    out, lse = backend.forward(q, k, v, spec, scale)

Names: "torch" (pure torch, the fp64 oracle's kernel), "torch_bf16", "sdpa_cpu" (torch's fused CPU
kernels), "sdpa_cuda" (torch's bundled flash-attention 2, varlen), "cudnn" (torch's cuDNN attention,
one call per packed segment), "flex" (torch.nn.attention.flex_attention with block masks from the
MaskSpec: every kind, CPU eager / CUDA compiled), "flash_attn" (the external flash-attn 2/3 package,
varlen; probed, never imported unconditionally: a clear error when requested but missing), and the
wrappers "prefix_full[<name>]" (DFlash/DSpark prefix masks on a full-segment kernel) and
"tiled[<name>]" (the backward in square tiles of 16384 rows x keys: kernel workspaces and gradient
temporaries bounded by the tile; see tiled.py).

``auto`` picks, per mask kind: CUDA -> flash_attn when the package is installed, else sdpa_cuda
(causal/full; prefix through prefix_full[flash_attn] / prefix_full[sdpa_cuda], replicated query
rows), else torch; CPU -> sdpa_cpu (fp32/fp64) else torch.
``auto`` does not pick "flex" for any mask kind, on CPU or CUDA (decision of issue 3): on CPU flex
runs unfused (it materialises the [H, Tq, Tk] scores); on CUDA it needs a Triton compile per new
shape (dynamic shapes after the first recompile) and had not been timed on the H200 against the
measured flash/cuDNN paths when it was added (the causal/full kinds have exact fused kernels there;
the prefix kind is the only one it could win, without replicated rows). Run
``python -m repro.bench.gpu_attention --flex-checks --block-backend flex`` on the GPU to measure it;
switch this order only on that evidence. "cudnn", "flex" and "tiled[...]" are opt-in by name.
"""
from __future__ import annotations

import torch

from kernels.attention.backends.base import Backend, acc_dtype, check_qkv
from kernels.attention.backends.cudnn import CudnnBackend
from kernels.attention.backends.flash_attn import FlashAttnBackend
from kernels.attention.backends.flex import FlexBackend
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
    "flex": FlexBackend(),
    "flash_attn": FlashAttnBackend(),
}
_REGISTRY.update({f"prefix_full[{n}]": PrefixAsFull(_REGISTRY[n])
                  for n in ("torch", "sdpa_cpu", "sdpa_cuda", "cudnn", "flash_attn")})
_REGISTRY.update({f"tiled[{n}]": TiledBackward(_REGISTRY[n])
                  for n in ("torch", "sdpa_cpu", "sdpa_cuda", "cudnn", "flash_attn")})
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
            why = b.unavailable_reason(spec, device, dtype)
            raise ValueError(f"backend {name!r} cannot run mask kind {spec.kind!r} on {device.type} "
                             f"with {dtype}" + (f": {why}" if why else ""))
        return b
    order = (["flash_attn", "sdpa_cuda", "prefix_full[flash_attn]", "prefix_full[sdpa_cuda]",
              "torch_bf16" if dtype in (torch.bfloat16, torch.float16) else "torch"]
             if device.type == "cuda" else ["sdpa_cpu", "torch"])
    for n in order:
        if _REGISTRY[n].supports(spec, device, dtype):
            return _REGISTRY[n]
    raise ValueError(f"no backend for {spec.kind!r} on {device.type} with {dtype}")


__all__ = ["NAMES", "Backend", "MaskSpec", "acc_dtype", "check_qkv", "get", "select"]
