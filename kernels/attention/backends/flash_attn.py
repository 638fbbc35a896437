"""External flash-attention varlen backend ("flash_attn"): Dao-AILab's flash-attn 2, or 3 (Hopper).

Probed, never imported at module load: ``available()`` says whether a usable package is installed,
``version()`` which one (FA3's ``flash_attn_interface`` first, then FA2's ``flash_attn``); asking
for the backend without one raises an error saying so. "causal" and "full" MaskSpecs, fp16/bf16 on
CUDA; GQA is native (FA maps query head h to K/V head h // (H / G)); "prefix" goes through
prefix_full[flash_attn]. Facts the adapter relies on (read from the flash-attention sources):

  forward   flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            softmax_scale=, causal=, return_attn_probs=True) on packed [total, heads, D] tensors with
            int32 cu_seqlens on the device. FA2 returns (out, softmax_lse, S_dmask), FA3 (out,
            softmax_lse). softmax_lse is [H, total_q] fp32 in FA2 >= 2.6 and FA3, [B, H, max_seqlen_q]
            (padded per sequence) in older FA2: both are converted to the contract's [T, H].
            causal=True aligns the mask to the bottom-right corner, which equals ours because causal
            specs have Lq == Lk per segment. Rows without keys come back with out = 0 and an LSE of
            +inf or -inf depending on the build: normalised to -inf.
  backward  the private varlen backward with the *joint* out and lse, which writes into dq/dk/dv we
            allocate: FA2 ``flash_attn_interface._flash_attn_varlen_backward(dout, q, k, v, out,
            softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            dropout_p, softmax_scale, causal, window_size_left/right (or window_size), softcap,
            alibi_slopes, deterministic, rng_state)``; FA3 ``_flash_attn_backward(dout, q, k, v, out,
            softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
            dq, dk, dv, softmax_scale, is_causal, window_size_left, window_size_right, softcap,
            deterministic, sm_margin)``. Arguments are passed by name from the installed function's own
            signature (they moved between releases). The joint LSE goes back in the layout the
            forward produced, with -inf rows as +inf (P = 0, zero gradient).

    from kernels.attention.backends.flash_attn import FlashAttnBackend, available
"""
from __future__ import annotations

import importlib
import inspect

import torch

from kernels.attention.backends.base import Backend
from kernels.attention.backends.varlen_index import lse_to_kernel, padded_lse_rows, varlen_bounds
from kernels.attention.spec import MaskSpec

_PROBE: dict = {}


def _load():
    """(version, forward fn, backward fn, module name) of the installed flash-attn, or a reason string."""
    if "res" in _PROBE:
        return _PROBE["res"]
    errors = []
    for ver, mod_name, fwd_name, bwd_mod, bwd_name in (
            ("3", "flash_attn_interface", "flash_attn_varlen_func", "flash_attn_interface", "_flash_attn_backward"),
            ("2", "flash_attn", "flash_attn_varlen_func", "flash_attn.flash_attn_interface",
             "_flash_attn_varlen_backward")):
        try:
            mod = importlib.import_module(mod_name)
            bmod = importlib.import_module(bwd_mod)
            fwd, bwd = getattr(mod, fwd_name), getattr(bmod, bwd_name)
        except (ImportError, AttributeError, OSError, RuntimeError) as exc:
            errors.append(f"{mod_name}: {type(exc).__name__}: {exc}")
            continue
        _PROBE["res"] = (ver, fwd, bwd, mod_name)
        return _PROBE["res"]
    _PROBE["res"] = "flash-attn is not installed or not importable (" + "; ".join(errors) + ")"
    return _PROBE["res"]


def reset_probe() -> None:
    """Forget the probe result (tests that install or remove a flash_attn module)."""
    _PROBE.clear()


def available() -> bool:
    return not isinstance(_load(), str)


def version() -> str | None:
    res = _load()
    return None if isinstance(res, str) else res[0]


def _params(fn) -> dict:
    f = getattr(fn, "_init_fn", fn)                       # torch.library custom ops keep the python fn here
    return inspect.signature(f).parameters


def _call_by_name(fn, values: dict):
    """Call ``fn`` with the entries of ``values`` that its signature names (aliases resolved by the
    caller); a required parameter we do not know is an error naming it."""
    kwargs = {}
    for name, p in _params(fn).items():
        if name in values:
            kwargs[name] = values[name]
        elif p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise RuntimeError(f"flash-attn backward {getattr(fn, '__name__', fn)} has a parameter {name!r} this "
                               f"adapter does not know; supported: flash-attn 2.x and 3.x varlen backward")
    return fn(**kwargs)


def lse_to_rows(lse: torch.Tensor, spec: MaskSpec, H: int) -> tuple[torch.Tensor, str]:
    """flash-attn softmax_lse -> ([T, H] fp32, layout): [H, total_q] "packed" or [B, H, >= max_q] "padded"."""
    if lse.dim() == 2 and lse.shape == (H, spec.num_q):
        return lse.transpose(0, 1).float(), "packed"
    if lse.dim() == 3 and lse.shape[0] == spec.cu_q.numel() - 1 and lse.shape[1] == H:
        return padded_lse_rows(lse, spec).float(), "padded"
    raise RuntimeError(f"unexpected flash-attn softmax_lse shape {tuple(lse.shape)} for {H} heads, "
                       f"{spec.num_q} packed rows in {spec.cu_q.numel() - 1} sequences")


class FlashAttnBackend(Backend):
    name = "flash_attn"

    def unavailable_reason(self, spec, device, dtype) -> str | None:
        res = _load()
        if isinstance(res, str):
            return res + "; pip install flash-attn (CUDA build) or pick another backend"
        if spec.kind not in ("causal", "full"):
            return f"flash-attn varlen runs 'causal'/'full' masks (use prefix_full[flash_attn] for {spec.kind!r})"
        if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
            return f"flash-attn needs fp16/bf16 CUDA tensors, got {dtype} on {device.type}"
        return None

    def supports(self, spec, device, dtype) -> bool:
        return self.unavailable_reason(spec, device, dtype) is None

    def _lib(self):
        res = _load()
        if isinstance(res, str):
            raise RuntimeError(f"backend 'flash_attn' was requested but {res}")  # noqa: TRY004 -- missing package
        return res

    def forward(self, q, k, v, spec, scale):
        ver, fwd, _bwd, _ = self._lib()
        T, H, _D = q.shape
        cu_q, cu_k, mq, mk = varlen_bounds(spec, q.device)
        if mq == 0 or mk == 0:
            return torch.zeros_like(q), torch.full((T, H), float("-inf"), dtype=torch.float32, device=q.device)
        causal = spec.kind == "causal"
        if "return_attn_probs" in _params(fwd):
            res = fwd(q, k, v, cu_q, cu_k, mq, mk, softmax_scale=scale, causal=causal, return_attn_probs=True)
        else:                                   # early FA3 builds always return (out, softmax_lse)
            res = fwd(q, k, v, cu_q, cu_k, mq, mk, softmax_scale=scale, causal=causal)
        if not isinstance(res, (tuple, list)) or len(res) < 2:
            raise TypeError(f"flash-attn {ver} flash_attn_varlen_func(return_attn_probs=True) returned "
                               f"{type(res).__name__}, expected (out, softmax_lse, ...)")
        out, lse = res[0], res[1]
        lse, layout = lse_to_rows(lse, spec, H)
        spec._cache[("flash_lse_layout", str(q.device))] = layout
        lse = torch.where(torch.isinf(lse) & (lse > 0), torch.full_like(lse, float("-inf")), lse)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        _ver, _fwd, bwd, _ = self._lib()
        cu_q, cu_k, mq, mk = varlen_bounds(spec, q.device)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if mq == 0 or mk == 0:
            return dq.zero_(), dk.zero_(), dv.zero_()
        layout = spec._cache.get(("flash_lse_layout", str(q.device)), "packed")
        l = lse.float()
        l = torch.where(torch.isneginf(l), torch.full_like(l, float("inf")), l)
        causal = spec.kind == "causal"
        values = {"dout": dout.to(q.dtype).contiguous(), "q": q, "k": k, "v": v, "out": out.to(q.dtype).contiguous(),
                  "softmax_lse": lse_to_kernel(l, spec, layout, mq), "dq": dq, "dk": dk, "dv": dv,
                  "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "max_seqlen_q": mq, "max_seqlen_k": mk,
                  "dropout_p": 0.0, "softmax_scale": scale, "causal": causal, "is_causal": causal,
                  "window_size_left": -1, "window_size_right": -1, "window_size": (-1, -1), "softcap": 0.0,
                  "alibi_slopes": None, "deterministic": False, "rng_state": None, "zero_tensors": False,
                  "seqused_q": None, "seqused_k": None, "sequed_q": None, "sequed_k": None, "sm_margin": 0}
        _call_by_name(bwd, values)
        return dq, dk, dv
