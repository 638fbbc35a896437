"""Where an RL step's time goes, per row: the rollout and its phases (the prefill, the draft's propose, the policy's
verify step, the acceptance, the draft's observe and the host's waits on the device), the update's phases (the
policy's forward and backward over its microbatches, the draft's deferred pass, clipping and the optimizer step) and
the weight push, each as host time, device (kernel) time and kernel count from torch.profiler, for one step of each
row after warm-up steps. Kernels replayed from a CUDA graph count in the phase that launched the graph.

The tables report a drafted row's update overhead over its no-draft row (Table 1 on one H100: 9.8-22.4% for the dense
rows) and a drafted policy forward that costs 1.7-2.2x a plain one; this study says which phase holds each. Rows are
built as ``repro.rl.run`` builds them (a profile's RL section, random init unless ``--warm-start`` names an SFT
folder: the work per step is the same, the acceptance is not). Prints one table; the workflow's ``table1`` is where
results come from.

    PYTHONPATH=. python studies/rl_profile/step_phases.py --profile h200 --artifact table1 \
        --rows "Qwen3-8B/no draft,Qwen3-8B/EAGLE-3,Qwen3-8B/DFlash" --warm-steps 3
"""
from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import sys
import tempfile
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from repro.rl.config import load_run_profile
from repro.rl.run import build_row

PHASES = ("step.rollout", "rollout.prefill", "rollout.propose", "rollout.verify", "rollout.accept", "rollout.observe",
          "rollout.wait", "step.update", "update.policy_forward", "update.policy_backward", "update.draft",
          "update.clip_and_step", "step.push")


_LAUNCHES = ("cudaLaunch", "cuLaunch", "cudaGraphLaunch")


def launched_kernels(events) -> list:
    """(device kernel event, host time of its launch) for each kernel: a kernel shares its CUDA correlation id
    (``FunctionEvent.id``) with the runtime call that launched it; a kernel whose launch was not recorded falls
    back to the start of the operator it is linked to (``linked_correlation_id``)."""
    cpu = torch.autograd.DeviceType.CPU
    launch_at = {e.id: e.time_range.start for e in events if e.device_type == cpu and e.name.startswith(_LAUNCHES)}
    linked = lambda e: getattr(e, "linked_correlation_id", 0)   # noqa: E731  (absent from torch 2.11's events)
    op_at = {e.id: e.time_range.start for e in events
             if e.device_type == cpu and not e.name.startswith(_LAUNCHES) and not linked(e)}
    out = []
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t = launch_at.get(e.id, op_at.get(linked(e)))
            if t is not None:
                out.append((e, t))
    return out


def phase_spans(events, names=PHASES) -> dict[str, list[tuple[float, float]]]:
    """{name: host (start, end) of each of its named ranges} for the ranges ``names``."""
    spans = {name: [] for name in names}
    for e in events:
        if e.name in spans and e.device_type == torch.autograd.DeviceType.CPU:
            spans[e.name].append((e.time_range.start, e.time_range.end))
    return spans


def _within(t: float, spans) -> bool:
    return any(a <= t <= b for a, b in spans)


def phase_times(prof) -> dict[str, dict[str, float]]:
    """{phase: host ms, device ms, kernels} of one profiled step: host time is the range's own span; device time
    and kernels are those of the kernels launched inside it (matched through their launch's correlation id)."""
    events = list(prof.events())
    kernels = [(t, e.time_range.elapsed_us() / 1e3) for e, t in launched_kernels(events)]
    out = {}
    for name, spans in phase_spans(events).items():
        inside = [ms for t, ms in kernels if _within(t, spans)]
        out[name] = {"host_ms": sum(b - a for a, b in spans) / 1e3, "device_ms": sum(inside),
                     "kernels": len(inside)}
    return out


def top_in_phase(prof, phase: str, n: int) -> tuple[list, list]:
    """The ``n`` operators with the most host self time inside ``phase``'s ranges, as (name, calls, self host ms),
    and the ``n`` kernels with the most device time launched inside them, as (name, launches, device ms). Named
    ranges (the phases themselves) are left out of the operators."""
    events = list(prof.events())
    spans = phase_spans(events, (phase,))[phase]
    ops, kernels = defaultdict(lambda: [0, 0.0]), defaultdict(lambda: [0, 0.0])
    for e in events:
        if (e.device_type == torch.autograd.DeviceType.CPU and _within(e.time_range.start, spans)
                and e.name not in PHASES):
            ops[e.name][0] += 1
            ops[e.name][1] += e.self_cpu_time_total / 1e3
    for e, t in launched_kernels(events):
        if _within(t, spans):
            kernels[e.name][0] += 1
            kernels[e.name][1] += e.time_range.elapsed_us() / 1e3
    def best(table):
        return sorted(((k, c, ms) for k, (c, ms) in table.items()), key=lambda r: -r[2])[:n]
    return best(ops), best(kernels)


def save_trace(prof, folder: str, row: str) -> str:
    """The profiled step as a gzipped Chrome trace (chrome://tracing, Perfetto) named after the row."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, re.sub(r"[^A-Za-z0-9._-]+", "_", row).strip("_") + ".trace.json.gz")
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        raw = tmp.name
    try:
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(path + ".part", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(path + ".part", path)
    finally:
        os.unlink(raw)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu-tiny", help="profile name, or a path to a profile .yaml file")
    ap.add_argument("--artifact", default="table1", choices=("table1", "table2", "fig3", "fig4"))
    ap.add_argument("--rows", default="", help="comma-separated row labels (default: every row of the artifact)")
    ap.add_argument("--warm-start", default="", help="SFT warm-start folder (repro.rl.sft); empty: random init")
    ap.add_argument("--warm-steps", type=int, default=2, help="steps run before the profiled one (compiles, captures)")
    ap.add_argument("--top", type=int, default=0,
                    help="also list, for the update and the rollout, this many operators by host self time and "
                         "kernels by device time")
    ap.add_argument("--trace-dir", default="", help="folder for each row's profiled step as a gzipped Chrome trace")
    args = ap.parse_args(argv)
    if args.warm_steps < 1:
        ap.error(f"--warm-steps {args.warm_steps} is invalid: expected at least 1 (the first step compiles)")
    section = load_run_profile(args.profile).get(args.artifact) or {}
    rows = [r.strip() for r in args.rows.split(",") if r.strip()] or list(section.get("rows", {}))
    if not rows:
        ap.error(f"profile {args.profile!r} has no {args.artifact} rows")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities):      # the profiler's own start-up (CUPTI) kept out of the first row's times
        torch.ones(1, device="cuda" if torch.cuda.is_available() else "cpu").add_(1)
    print(f"{'row':<28} {'phase':<24} {'host ms':>9} {'device ms':>10} {'kernels':>8}")
    for row in rows:
        with tempfile.TemporaryDirectory() as out:
            _, trainer, _ = build_row(args.profile, args.artifact, row, out=out, warm_start=args.warm_start)
            try:
                for step in range(args.warm_steps):
                    trainer.train_step(step)
                with profile(activities=activities) as prof:
                    metrics, *_ = trainer.train_step(args.warm_steps)
            finally:
                trainer.close()
        for name, t in phase_times(prof).items():
            if t["host_ms"]:
                print(f"{row:<28} {name:<24} {t['host_ms']:9.2f} {t['device_ms']:10.2f} {t['kernels']:8d}")
        for name in ("step.update", "step.rollout") if args.top > 0 else ():
            ops, kernels = top_in_phase(prof, name, args.top)
            print(f"  {row} / {name}: operators by host self time (calls, ms)")
            for op, calls, ms in ops:
                print(f"    {ms:9.2f} {calls:6d}  {op[:100]}")
            print(f"  {row} / {name}: kernels by device time (launches, ms)")
            for k, calls, ms in kernels:
                print(f"    {ms:9.2f} {calls:6d}  {k[:100]}")
        if args.trace_dir:
            print(f"  trace: {save_trace(prof, args.trace_dir, row)}")
        print(f"{row:<28} {'(as logged)':<24} update {metrics['train/update_time_s'] * 1e3:.1f} ms, draft's "
              f"forward and loss {metrics.get('train/draft_time_s', 0.0) * 1e3:.1f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
