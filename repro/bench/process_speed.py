"""Does a co-training process run the *same* no-draft update slower than a no-draft process, and after what?

On the H200 the drafted rows' updates run 10-40% slower than the no-draft row's across processes, while in
one process a drafted update costs the no-draft update plus the draft's ~12 ms
(repro.bench.step_breakdown's update_ab). This tool times one fixed no-draft update (the no-draft row's
policy and rollout batch) in one process at stages:

  A  after its own warm-up;
  B  after a drafted trainer (the ``--draft-row``) is built beside it;
  C  after that trainer ran ``--draft-steps`` co-training steps (graphed draft rollouts, drafted updates);
  D  after ``gc.collect(); gc.freeze()``.

With each stage: thread count, child processes, Python objects tracked by the GC, whether torch's
compiler stack (dynamo/inductor) was imported. Writes ``<out>/process_speed.json`` (samples, provenance).

    python -m repro.bench.process_speed --profile h200 --out $OUT/process_speed          # one GPU, ~2 min
    python -m repro.bench.process_speed --profile cpu-tiny --repeats 2 --out /tmp/ps     # CPU check
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

from repro.bench.common import summarize
from repro.report.profiles import load_profile
from repro.report.provenance import provenance, write_json_atomic
from repro.rl.config import run_config_from_profile
from repro.rl.grpo import group_advantages
from repro.rl.summary import run_dir_name
from repro.rl.tokenizer import build_workload_tokenizer
from repro.rl.trainer import CoTrainer


def process_state() -> dict:
    status = Path("/proc/self/status")
    threads = next((int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("Threads:")),
                   -1) if status.exists() else -1
    children = 0
    proc = Path("/proc")
    if proc.exists():
        me = str(os.getpid())
        for p in proc.iterdir():
            if p.name.isdigit():
                try:
                    if (p / "stat").read_text().split(") ")[1].split()[1] == me:
                        children += 1
                except (OSError, IndexError):
                    continue
    return {"threads": threads, "children": children, "gc_objects": len(gc.get_objects()),
            "gc_frozen": gc.get_freeze_count(), "dynamo_imported": "torch._dynamo" in sys.modules,
            "inductor_imported": "torch._inductor" in sys.modules}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--base-row", default="Qwen3-8B/no draft", help="table1 row whose no-draft update is timed")
    ap.add_argument("--draft-row", default="Qwen3-8B/DSpark", help="table1 row of the co-training trainer")
    ap.add_argument("--draft-steps", type=int, default=3, help="co-training steps before stage C (default 3)")
    ap.add_argument("--repeats", type=int, default=8, help="timed updates per stage (default 8)")
    ap.add_argument("--out", type=Path, default=Path("process_speed_out"))
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.draft_steps < 0:
        ap.error(f"--repeats must be >= 1 and --draft-steps >= 0, got {args.repeats} and {args.draft_steps}")
    os.environ.setdefault("WANDB_MODE", "disabled")
    prof = load_profile(args.profile)
    args.out.mkdir(parents=True, exist_ok=True)
    tok = build_workload_tokenizer(args.out / "tokenizer", int(prof["rl"].get("vocab_size", 512)), 0)

    def trainer(row: str) -> CoTrainer:
        return CoTrainer(run_config_from_profile(prof, "table1", row, out=str(args.out / "runs" / run_dir_name(row))),
                         tok)

    base = trainer(args.base_row)
    for s in range(2):
        base.train_step(s)
    batch = base.rollout(2)
    cfg = base.cfg
    adv = group_advantages(batch.rewards, cfg.grpo.generations_per_prompt, cfg.grpo.normalize_std)

    def stage(name: str) -> dict:
        base.update.step(batch, adv, anchor_seed=0, temperature=cfg.grpo.temperature)       # one untimed
        t = [base.update.step(batch, adv, anchor_seed=k, temperature=cfg.grpo.temperature).update_time_s
             for k in range(args.repeats)]
        res = {"update_s": summarize(t), "samples": t, **process_state()}
        print(f"[{name}] no-draft update {res['update_s']['median'] * 1e3:.1f} ms (p20 {res['update_s']['p20'] * 1e3:.1f}, "
              f"p80 {res['update_s']['p80'] * 1e3:.1f}); threads {res['threads']}, children {res['children']}, "
              f"gc objects {res['gc_objects']}, dynamo {res['dynamo_imported']}, inductor {res['inductor_imported']}",
              flush=True)
        return res

    report = {"config": vars(args) | {"out": str(args.out)}, "stages": {}}
    report["stages"]["A_own_warmup"] = stage("A")
    drafted = trainer(args.draft_row)
    report["stages"]["B_drafted_trainer_built"] = stage("B")
    for s in range(args.draft_steps):
        drafted.train_step(s)
    report["stages"]["C_after_drafted_steps"] = stage("C")
    gc.collect()
    gc.freeze()
    report["stages"]["D_gc_frozen"] = stage("D")
    a = report["stages"]["A_own_warmup"]["update_s"]["median"]
    report["slowdown_vs_A"] = {k: v["update_s"]["median"] / a for k, v in report["stages"].items()}
    write_json_atomic(args.out / "process_speed.json", {**report, "provenance": provenance(report["config"])})
    print("slowdown vs A: " + ", ".join(f"{k} {v:.2f}x" for k, v in report["slowdown_vs_A"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
