"""Run several rows of one RL artifact in one process, their steps interleaved: step s of every row before step s+1.

Why: on the one-GPU profile the update and the rollout are launch-bound, and the host's speed drifts. Fresh
processes timing the same no-draft update on the H200 (a KVM guest) measured 205-334 ms
(``results/1xh200/h200/host_binding/``), a spread larger than the update overheads Table 1 and Table 2 report. Rows
run one after another (``repro.rl.run`` per row) compare different time windows; in lockstep every row meets the
same drift (the order rotates each step) and the same process state, so a row's time against its baseline's is the
cost of its draft. Each row still trains exactly as alone (its own models, optimizers, seeds and run folder:
metrics.jsonl, checkpoints, run.json as ``repro.rl.run`` writes them; tests/rl/test_lockstep.py checks a lockstep
row's values equal its separate run's), resumes from its own last checkpoint, and runs its probe (``pp_probe``) after
the last step. What the rows share is memory that only one rollout uses at a time: their static policy caches live
on one pair of buffers (``SharedKVStorage``), so on one GPU a lockstep holds one policy cache, not one a row, and
their graphed calls capture into one memory pool per call (``shared_graph_pools``), not one a row. A SIGINT or
SIGTERM during the steps stops the process after the row step in flight with every row checkpointed after its last
finished step (``repro.rl.stop``); the same command continues from there.
A row written ``label@k`` is the row's sampling-seed replica k (profile key ``baseline_seeds``): it trains as its
separate ``repro.rl.run --sampling-seed k`` would, into ``<row folder>_sampling<k>``.

    python -m repro.rl.lockstep --artifact table1 --profile cpu-tiny --warm-start <sft folder> \\
        --rows "Qwen3-8B/no draft,Qwen3-8B/DFlash" --out-root /tmp/lockstep/table1
    (each row in <out-root>/<run_dir_name(row)>, as the workflow names them; an artifact section with
    ``lockstep: true`` makes the workflow run its rows this way, one job per policy, and the baseline's seed
    replicas, ``--rows "no draft@1,no draft@2"``, in one more)
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

from repro.core.io import write_json_atomic
from repro.core.layout import replica_run_name, run_dir_name
from repro.core.profile import ProfileError
from repro.core.specs import ARTIFACTS, ConfigError
from repro.decoding.cuda_graph import shared_graph_pools
from repro.decoding.policy_cache import SharedKVStorage
from repro.rl.config import ENGINES
from repro.rl.run import RESTART_HELP, build_row, row_logger, run_probes, write_run_record
from repro.rl.stop import StopOnSignal, say


def rotated(items: list, k: int) -> list:
    """``items`` started at position k (mod len): step k's order of the rows."""
    k %= max(1, len(items))
    return items[k:] + items[:k]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", required=True, choices=ARTIFACTS)
    ap.add_argument("--rows", required=True, help="comma-separated row labels (keys of <artifact>.rows); label@k: "
                    "the row with sampling seed k (its prompts stay --seed's), into <row folder>_sampling<k>")
    ap.add_argument("--profile", default="cpu-tiny", help="profile name, or a path to a profile .yaml file")
    ap.add_argument("--engine", choices=ENGINES, default=None)
    ap.add_argument("--checkpoint-root", default="")
    ap.add_argument("--out-root", required=True, help="folder of the rows' run folders")
    ap.add_argument("--warm-start", default="", help="SFT warm-start folder (repro.rl.sft); empty: random init")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--restart-on-config-change", action="store_true", help=RESTART_HELP)
    ap.add_argument("--record", default="", help="JSON file written last (atomically): the rows and their run "
                    "folders (the workflow's marker that the lockstep job finished)")
    args = ap.parse_args(argv)
    rows = list(dict.fromkeys(r.strip() for r in args.rows.split(",") if r.strip()))
    if not rows:
        ap.error(f"--rows names no row: {args.rows!r}")
    if args.threads:
        torch.set_num_threads(args.threads)
    plan = []            # (run folder name, row, sampling seed)
    for entry in rows:
        row, at, k = entry.rpartition("@")
        if not at:
            plan.append((run_dir_name(entry), entry, None))
        elif row and k.isdigit():
            plan.append((replica_run_name(run_dir_name(row), int(k)), row, int(k)))
        else:
            ap.error(f"--rows entry {entry!r} is invalid: expected a row label, or label@k with k an integer >= 0")
    # the rows' rollouts (and updates) run one after another, so their static policy caches share one pair of
    # buffers and their graphed calls one memory pool per call (repro.decoding.cuda_graph.shared_graph_pools): on
    # one GPU the lockstep holds each call's largest graph's temporaries once, not once a row and request shape
    with shared_graph_pools():
        return _run_rows(args, rows, plan)


def _run_rows(args: argparse.Namespace, rows: list[str], plan: list[tuple[str, str, int | None]]) -> int:
    runs = []            # (name, profile, trainer, first step to run); every config checked before any training
    kv_storage = SharedKVStorage()
    try:
        for name, row, sampling in plan:
            runs.append((name, *build_row(args.profile, args.artifact, row, out=str(Path(args.out_root) / name),
                                          seed=args.seed, warm_start=args.warm_start, engine=args.engine,
                                          checkpoint_root=args.checkpoint_root, sampling_seed=sampling,
                                          restart_on_config_change=args.restart_on_config_change,
                                          kv_storage=kv_storage)))
    except (ConfigError, ProfileError, FileNotFoundError) as exc:
        print(f"lockstep: error: {exc}", file=sys.stderr)
        return 2
    steps = {t.cfg.steps for _, _, t, _ in runs}
    if len(steps) != 1:
        print(f"lockstep: error: the rows train different numbers of steps {sorted(steps)}; expected one",
              file=sys.stderr)
        return 2
    n_steps = steps.pop()
    logged: dict[str, list[dict]] = {name: [] for name, *_ in runs}
    stopped = False
    with contextlib.ExitStack() as stack:
        logs = {name: stack.enter_context(row_logger(t, first)) for name, _, t, first in runs}
        try:
            row_steps = ((step, name, trainer) for step in range(min(first for *_, first in runs), n_steps)
                         for name, _, trainer, first in rotated(runs, step) if step >= first)
            with StopOnSignal("lockstep") as stop:
                for step, name, trainer in row_steps:
                    logged[name].append(trainer.run_step(step, logs[name]))
                    if stop.requested:
                        break
            # a stop after the last row's last step changes nothing; otherwise each row keeps what it ran
            stopped = stop.requested and any(t.last_done != n_steps - 1 for _, _, t, _ in runs)
            if stopped:
                for _, _, trainer, _ in runs:
                    trainer.save_after_stop()
        finally:
            errors = []
            for _, _, trainer, _ in runs:      # every row closes (its last checkpoint lands) before an error
                try:
                    trainer.close()
                except Exception as exc:         # noqa: BLE001 - raised below, once every row is closed
                    errors.append(exc)
            if errors:
                raise errors[0]
        if stopped:
            say("lockstep: stopped; rows at steps " + ", ".join(f"{name} {t.last_done}" for name, _, t, _ in runs)
                + "; each checkpointed there")
            return stop.exit_code
        for name, prof, trainer, _ in runs:
            run_probes(prof, trainer, logs[name])
    for name, _, trainer, first in runs:
        write_run_record(trainer, first, logged[name], lockstep_rows=rows)
    if args.record:
        write_json_atomic(args.record, {"artifact": args.artifact, "rows": rows,
                                        "runs": {name: t.cfg.out for name, _, t, _ in runs}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
