"""The attention package's Triton kernel modules, loaded on first use, and a failure remembered.

A module imports only where Triton does; a kernel that fails to build on a machine (a Triton version the
kernels were not written for) is reported once and then not tried again, so callers fall back to their torch ops.

    mod = triton_ops.load("replica_merge_triton")      # kernels.attention.<name>, or None
    mod = triton_ops.choose("replica_merge_triton", "auto", "prefix_full", q)   # None: not for q, or not here
    res = triton_ops.attempt("replica_merge_triton", mod, "auto", "prefix_full", "sum_replicas", *args)
                                                        # mod.sum_replicas(*args); a failure warns once, gives None
    triton_ops.error("replica_merge_triton")           # why it is None ("" when it loaded or was never tried)
"""
from __future__ import annotations

import importlib
import warnings

import torch

_MODS: dict = {}
_ERRORS: dict = {}


def load(name: str):
    """``kernels.attention.<name>``, or None where Triton does not import or its kernels failed."""
    if name not in _MODS:
        try:
            _MODS[name] = importlib.import_module(f"kernels.attention.{name}")
        except ImportError as exc:
            _MODS[name], _ERRORS[name] = None, f"{type(exc).__name__}: {exc}"
    return _MODS[name]


def choose(name: str, impl: str, who: str, q):
    """The kernel module this call runs on, or None for the caller's torch ops: ``impl`` "torch" never; "auto" for
    CUDA tensors that are not fp64 (fp64, the reference checks, keeps its fp64 torch ops) when the kernels load;
    "triton" always, and an error naming ``who`` when they do not load."""
    if impl == "torch" or (impl == "auto" and (not q.is_cuda or q.dtype == torch.float64)):
        return None
    mod = load(name)
    if mod is None and impl == "triton":
        why = error(name)
        raise RuntimeError(f"{who} needs Triton (pip install triton)" + (f"; here: {why}" if why else ""))
    return mod


def failed(name: str, exc: BaseException, who: str) -> None:
    """Mark ``name``'s kernels as failed on this machine and warn once, naming ``who`` falls back."""
    _MODS[name] = None
    _ERRORS[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    warnings.warn(f"{who}: the Triton kernels failed ({_ERRORS[name]}); using the torch ops", RuntimeWarning,
                  stacklevel=3)


def attempt(name: str, mod, impl: str, who: str, fn: str, *args):
    """``mod.<fn>(*args)``. Under ``impl`` "auto" a failure (a kernel that does not build here; nothing was
    written, compilation precedes the launch) is reported once (``failed``) and gives None; "triton" raises it."""
    try:
        return getattr(mod, fn)(*args)
    except Exception as exc:
        if impl == "triton":
            raise
        failed(name, exc, who)
        return None


def error(name: str) -> str:
    return _ERRORS.get(name, "")
