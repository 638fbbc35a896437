"""The attention package's Triton kernel modules, loaded on first use, and a failure remembered.

A module imports only where Triton does; a kernel that fails to build on a machine (a Triton version the
kernels were not written for) is reported once and then not tried again, so callers fall back to their torch ops.

    mod = triton_ops.load("replica_merge_triton")      # kernels.attention.<name>, or None
    res = triton_ops.attempt("replica_merge_triton", mod, "auto", "prefix_full", "sum_replicas", *args)
                                                        # mod.sum_replicas(*args); a failure warns once, gives None
    triton_ops.error("replica_merge_triton")           # why it is None ("" when it loaded or was never tried)
"""
from __future__ import annotations

import importlib
import warnings

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
