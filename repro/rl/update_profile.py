"""torch.profiler around one joint update of a distributed run: where a PP x CP update's time goes, per rank.

``profiled(stem, device, meta)`` is a context manager: the code inside runs under torch.profiler (CPU, and CUDA
on GPUs, synchronised before the profile closes), and ``<stem>.txt`` (the profiler's table, top 40 by self device
time on GPUs, self CPU time on CPU) and ``<stem>.json`` (wall time, operator count, the top operators by self CPU
and by self device time, ``meta``) are written when it closes. ``repro.rl.dist_run --profile-update N`` wraps step
N's update on every rank in it; ``repro.bench.profile_step`` shares ``top_ops``.

    torchrun --nproc-per-node 2 -m repro.rl.dist_run ... --profile-update 2   # <out>/profile_update_rank<r>.*
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.profiler import ProfilerActivity, profile

from repro.report.provenance import write_atomic, write_json_atomic


def top_ops(averages, top: int, sort: str) -> list[dict]:
    """The ``top`` operators of a finished profile's ``key_averages()`` by ``sort`` (one of its attributes), as plain
    rows. Takes the averages, not the profile: aggregating a large profile costs seconds per call (a CPU profile of
    320k operators: 23 s the first time, 3.4 s each time after)."""
    rows = []
    for e in sorted(averages, key=lambda e: getattr(e, sort, 0), reverse=True)[:top]:
        rows.append({"name": e.key, "count": e.count, "self_cpu_us": e.self_cpu_time_total,
                     "cpu_total_us": e.cpu_time_total,
                     "device_us": getattr(e, "self_device_time_total", 0.0)})
    return rows


@contextlib.contextmanager
def profiled(stem: Path, device: str, meta: dict[str, Any]) -> Iterator[None]:
    cuda = str(device).startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    stem.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with profile(activities=acts) as p:
        yield
        if cuda:
            torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    ka = p.key_averages()
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    write_atomic(stem.with_suffix(".txt"), ka.table(sort_by=sort, row_limit=40))
    write_json_atomic(stem.with_suffix(".json"), {
        **meta, "wall_s": wall, "n_ops": sum(e.count for e in ka),
        "top_self_cpu": top_ops(ka, 25, "self_cpu_time_total"),
        "top_device": top_ops(ka, 25, "self_device_time_total") if cuda else []})
