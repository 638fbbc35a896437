"""Where a co-training step's time goes: phase breakdown and torch.profiler tables of rollout and update.

For each table1 row of a profile (random-initialised policy and draft: the cost of a step does not
depend on what the weights have learnt, only on how many verify steps the rollout takes, which is
reported), builds ``repro.rl.trainer.CoTrainer``, runs warm-up steps, then one step under
``torch.profiler`` with ``record_function`` labels on the engine's phases (policy forward, draft
proposal, verification, bookkeeping) and on the update, and writes:

* ``profile.json``: per row, wall time of rollout and update, verify steps, time per verify step,
  host-side time per phase, device-synchronising calls, the top operators by self CPU and by
  device time (raw rows of ``key_averages``), plus provenance;
* ``<row>.txt``: the profiler's tables as text, for reading.

    python -m repro.bench.profile_step --profile h200 --out $OUT/profile          # one GPU, ~2 min
    python -m repro.bench.profile_step --profile cpu-tiny --rows "Qwen3-8B/no draft"  # CPU check
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from repro.report.profiles import load_profile
from repro.report.provenance import provenance, write_json_atomic
from repro.rl.config import artifact_rows, run_config_from_profile
from repro.rl.summary import run_dir_name
from repro.rl.tokenizer import build_workload_tokenizer
from repro.rl.trainer import CoTrainer
from repro.rl.update_profile import top_ops

SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaEventSynchronize")


def _label(obj, name: str, label: str) -> None:
    """Wrap ``obj.name`` so each call shows up as a ``record_function(label)`` range (once: the engine
    module's ``verify`` is shared by every row's trainer and must not be wrapped again)."""
    fn = getattr(obj, name)
    if getattr(fn, "profile_label", None) == label:
        return

    def wrapped(*a, **kw):
        with record_function(label):
            return fn(*a, **kw)
    wrapped.profile_label = label
    setattr(obj, name, wrapped)


def _instrument(tr: CoTrainer) -> None:
    import repro.rollout.engine as engine_mod
    eng = tr.engine
    _label(eng.policy, "decode_step", "phase/policy_forward")
    if eng.proposer is not None:
        _label(eng.proposer, "propose", "phase/draft_propose")
        _label(eng.proposer, "observe", "phase/draft_observe")
    _label(engine_mod, "verify", "phase/verify")
    _label(eng, "_commit", "phase/commit")
    _label(tr, "rollout", "step/rollout")
    _label(tr.update, "step", "step/update")
    _label(tr, "push", "step/push")


def profile_row(prof_cfg: dict, row: str, out: Path, warmup: int, device: str) -> dict:
    cfg = run_config_from_profile(prof_cfg, "table1", row, out=str(out / "runs" / run_dir_name(row)))
    tok = build_workload_tokenizer(out / "tokenizer", cfg.vocab_size, 0)
    tr = CoTrainer(cfg, tok)
    _instrument(tr)
    for s in range(warmup):
        tr.train_step(s)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    t0 = time.perf_counter()
    with profile(activities=acts) as p:
        m, batch, _ = tr.train_step(warmup)
        sync()
    wall = time.perf_counter() - t0
    ka = p.key_averages()
    phases = {e.key: {"count": e.count, "cpu_total_us": e.cpu_time_total,
                      "device_us": getattr(e, "device_time_total", 0.0)}
              for e in ka if e.key.startswith(("phase/", "step/"))}
    syncs = {e.key: e.count for e in ka if e.key in SYNC_EVENTS}
    steps = batch.counters.verify_steps if hasattr(batch.counters, "verify_steps") else None
    res = {"row": row, "wall_s": wall, "metrics": m, "phases": phases, "sync_calls": syncs,
           "verify_steps": steps, "n_kernels_or_ops": sum(e.count for e in ka),
           "top_self_cpu": top_ops(ka, 25, "self_cpu_time_total"),
           "top_device": top_ops(ka, 25, "self_device_time_total") if device == "cuda" else []}
    sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    (out / f"{run_dir_name(row)}.txt").write_text(ka.table(sort_by=sort, row_limit=40))
    return res


def table1_rows(prof_cfg: dict, profile: str, rows_arg: str) -> list[str]:
    """The table1 rows a --rows argument names (default: every row of the first policy); exits on a bad one."""
    rows = artifact_rows(prof_cfg, "table1")
    if rows_arg:
        wanted = [r.strip() for r in rows_arg.split(",") if r.strip()]
        bad = [r for r in wanted if r not in rows]
        if bad:
            raise SystemExit(f"--rows {bad} are not table1 rows of {profile!r}; expected some of {sorted(rows)}")
        return wanted
    first = next(iter(rows.values())).get("policy", "dense")
    return [r for r, s in rows.items() if s.get("policy", "dense") == first]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h200", help="profile whose table1 rows are profiled (default h200)")
    ap.add_argument("--rows", default="", help="comma-separated table1 rows (default: every row of the first policy)")
    ap.add_argument("--out", type=Path, default=Path("profile_step_out"))
    ap.add_argument("--warmup", type=int, default=2, help="unprofiled steps first (default 2)")
    args = ap.parse_args(argv)
    prof_cfg = load_profile(args.profile)
    wanted = table1_rows(prof_cfg, args.profile, args.rows)
    device = "cuda" if prof_cfg["hardware"]["device"] == "cuda" else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"profile": args.profile, "rows": {}, "errors": {}}
    for row in wanted:
        try:
            r = profile_row(prof_cfg, row, args.out, args.warmup, device)
        except Exception as exc:  # noqa: BLE001 -- one failing row keeps the others
            import traceback
            traceback.print_exc()
            report["errors"][row] = f"{type(exc).__name__}: {exc}"
            continue
        report["rows"][row] = r
        ph = r["phases"]
        print(f"[{row}] wall {r['wall_s']:.3f}s verify steps {r['verify_steps']} syncs {r['sync_calls']}", flush=True)
        for k in sorted(ph):
            print(f"    {k:24s} n={ph[k]['count']:5d} cpu {ph[k]['cpu_total_us'] / 1e3:9.1f} ms "
                  f"device {ph[k]['device_us'] / 1e3:9.1f} ms", flush=True)
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()
    report["provenance"] = provenance()
    write_json_atomic(args.out / "profile.json", report)
    return 0 if not report["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
