"""Attention backends and their selection.

    backend = select("auto", spec, device, dtype)      # or a name: "torch", "sdpa_cpu", "sdpa_cuda", ...
    out, lse = backend.forward(q, k, v, spec, scale)

Names: "torch" (pure torch, the fp64 oracle's kernel), "torch_bf16", "sdpa_cpu" (torch's fused CPU
kernels), "sdpa_cuda" (torch's bundled flash-attention 2, varlen), "cudnn" (torch's cuDNN attention,
one call per packed segment), "flex" (torch.nn.attention.flex_attention with block masks from the
MaskSpec: every kind, CPU eager / CUDA compiled), "flash4" (flash-attn-4, ``flash_attn.cute``: varlen
causal/full, prefix masks in one masked call; sm90+), "flash_attn" (the external flash-attn 2/3 package,
varlen), and the wrappers "prefix_full[<name>]" (DFlash/DSpark prefix masks on a full-segment kernel; with
":torch_fold" its replicas are folded back by torch scatters instead of the Triton kernels) and
"tiled[<name>]" (the backward in square tiles of 16384 rows x keys: kernel workspaces and gradient
temporaries bounded by the tile; see tiled.py). The external packages are probed, never imported
unconditionally: a clear error when one is requested but missing.

``auto`` picks, per mask kind, the first of ``CUDA_ORDER`` / ``CPU_ORDER`` that runs the case: on CUDA
flash4 when flash_attn.cute imports and the device is sm90+ (every kind; prefix masks as one masked call,
falling back to replicated segments by itself if that route fails there), else flash_attn when installed,
else sdpa_cuda (causal/full; prefix through prefix_full[flash_attn] / prefix_full[sdpa_cuda], replicated
query rows), else torch; on CPU sdpa_cpu (fp32/fp64) else torch. Figure 6 (repro.bench.fig6) times the
prefix routes side by side (block rows: today's prefix_full[sdpa_cuda], flash4's masked call,
prefix_full[flash4]); reorder on that evidence.
``auto`` does not pick "flex" for any mask kind (decision of issue 3): on CPU flex runs unfused (it
materialises the [H, Tq, Tk] scores); on CUDA it needs a Triton compile per new shape and has not been timed
on the H200 against the flash/cuDNN paths. "cudnn", "flex" and "tiled[...]" are opt-in by name.
"""
from __future__ import annotations

import torch

from kernels import backend_names  # the module, not its functions: they would hide the submodules prefix_full, tiled
from kernels.attention.backends.base import Backend, acc_dtype, check_qkv
from kernels.attention.backends.cudnn import CudnnBackend
from kernels.attention.backends.flash4 import Flash4Backend
from kernels.attention.backends.flash_attn import FlashAttnBackend
from kernels.attention.backends.flex import FlexBackend
from kernels.attention.backends.prefix_full import PrefixAsFull
from kernels.attention.backends.sdpa_cpu import SdpaCpuBackend
from kernels.attention.backends.sdpa_cuda import SdpaCudaBackend
from kernels.attention.backends.tiled import TiledBackward
from kernels.attention.backends.torch_ref import TorchBackend
from kernels.attention.spec import MaskSpec
from kernels.backend_names import NAMES, PREFIX_FULL_MERGES, WRAPPED

_REGISTRY: dict[str, Backend] = {
    "torch": TorchBackend(),
    "torch_bf16": TorchBackend(compute_dtype=torch.bfloat16),
    "sdpa_cpu": SdpaCpuBackend(),
    "sdpa_cuda": SdpaCudaBackend(),
    "cudnn": CudnnBackend(),
    "flex": FlexBackend(),
    "flash_attn": FlashAttnBackend(),
    "flash4": Flash4Backend(),
}
_REGISTRY.update({backend_names.prefix_full(n, suffix): PrefixAsFull(_REGISTRY[n], merge)
                  for n in WRAPPED for suffix, merge in PREFIX_FULL_MERGES.items()})
_REGISTRY.update({backend_names.tiled(n): TiledBackward(_REGISTRY[n]) for n in WRAPPED})
assert tuple(_REGISTRY) == NAMES[1:], "kernels/backend_names.py names every registered backend, in order"
CUDA_ORDER = ("flash4", "flash_attn", "sdpa_cuda", "prefix_full[flash_attn]", "prefix_full[sdpa_cuda]")
CPU_ORDER = ("sdpa_cpu", "torch")


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
    order = ([*CUDA_ORDER, "torch_bf16" if dtype in (torch.bfloat16, torch.float16) else "torch"]
             if device.type == "cuda" else CPU_ORDER)
    for n in order:
        if _REGISTRY[n].supports(spec, device, dtype):
            return _REGISTRY[n]
    raise ValueError(f"no backend for {spec.kind!r} on {device.type} with {dtype}")


__all__ = ["CPU_ORDER", "CUDA_ORDER", "NAMES", "Backend", "MaskSpec", "acc_dtype", "check_qkv", "get", "select"]
