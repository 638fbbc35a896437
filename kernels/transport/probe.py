"""What the installed torch offers for one-sided GPU transport, without side effects.

Reports whether CUDA IPC can be used (CUDA present), the NCCL version, and whether
``torch.distributed._symmetric_memory`` exposes ``put_signal``/``wait_signal`` (the one-sided put a
remote TapChannel transport would use). Nothing is allocated and no backend is switched.

    python -m kernels.transport.probe
"""
from __future__ import annotations

import json

import torch


def probe() -> dict:
    out: dict = {"torch": torch.__version__, "cuda": torch.cuda.is_available(), "cuda_ipc": False,
                 "nccl_version": None, "symm_mem": False, "symm_mem_put_signal": False}
    if torch.cuda.is_available():
        out["cuda_ipc"] = True
        out["device_count"] = torch.cuda.device_count()
        try:
            v = torch.cuda.nccl.version()
            out["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as exc:  # noqa: BLE001
            out["nccl_version"] = f"unavailable: {exc}"
    try:
        import torch.distributed._symmetric_memory as symm
        out["symm_mem"] = True
        out["symm_mem_put_signal"] = hasattr(symm, "put_signal") and hasattr(symm, "wait_signal")
    except Exception as exc:  # noqa: BLE001 - optional, alpha API: report why it is missing
        out["symm_mem_error"] = f"{type(exc).__name__}: {exc}"
    return out


if __name__ == "__main__":
    print(json.dumps(probe(), indent=1))
