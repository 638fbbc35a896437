"""One draft setting varied over a row's co-training runs, everything else equal: what it does to acceptance length.

For each row and each value of ``--key`` (a ``DraftSpec`` field of every draft in the profile: ``lr_warmup_steps``,
``loss_weight`` (0: the draft is frozen, the control for co-training itself), ``lr``, ...), one run of the artifact
(``repro.rl.run``) from the same SFT warm start and seed, in a scratch folder. ``sweep.json`` gets each run's
acceptance length, draft loss, reward, rollout time and validation accuracy per step, the mean acceptance length and
the first update's change (AL at step 1 over step 0), with provenance. It is rewritten as each run ends (``complete``
says whether all did), so a sweep cut short keeps what it finished. The run folders stay out of ``results/`` (their
env.json would join the artifact's own report).

    python -m studies.draft_controls.sweep --profile cpu-tiny --artifact fig3 --rows EAGLE-3,DFlash,DSpark \
        --key lr_warmup_steps --values 0,5,10,20 --warm-start results/<machine>/cpu-tiny/sft/dense-math --steps 16 \
        --out results/<machine>/cpu-tiny/draft_warmup
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from statistics import mean

import yaml

from repro.core.io import write_json_atomic
from repro.core.layout import run_dir_name
from repro.core.profile import ProfileError
from repro.core.provenance import provenance
from repro.core.specs import ConfigError, DraftSpec
from repro.rl.config import load_run_profile, run_config_from_profile

SWEEPABLE = sorted(f.name for f in dataclasses.fields(DraftSpec)
                   if f.name not in ("family", "options", "checkpoint", "path", "cuda_graph"))


def _values(text: str, key: str) -> list[float | int]:
    try:
        vals = [float(v) if "." in v or "e" in v.lower() else int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--values {text!r} is invalid: expected comma-separated numbers, e.g. 0,5,10") from None
    if not vals or any(v < 0 for v in vals):
        raise ConfigError(f"--values {text!r} is invalid: expected numbers >= 0 for draft.{key}")
    return vals


def derived_profile(profile: dict, artifact: str, key: str, value, steps: int) -> dict:
    """The profile with every draft's ``key`` set to ``value`` (and the artifact's steps)."""
    prof = json.loads(json.dumps(profile))
    for spec in prof["rl"]["drafts"].values():
        spec[key] = value
    if steps:
        prof[artifact]["steps"] = steps
    return prof


def run_one(args, derived: dict, scratch: Path, row: str, value) -> dict:
    """One run of ``row`` on ``derived`` (the profile with draft.<key> = value) in its scratch folder."""
    work = scratch / f"{run_dir_name(row)}-{args.key}{value}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "profile.yaml").write_text(yaml.safe_dump(derived, sort_keys=False))
    cmd = [sys.executable, "-m", "repro.rl.run", "--artifact", args.artifact, "--row", row,
           "--profile", str(work / "profile.yaml"), "--out", str(work / "run"), "--seed", str(args.seed),
           "--threads", str(args.threads)] + (["--warm-start", args.warm_start] if args.warm_start else [])
    with open(work / "run.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc:      # the scratch folder goes with the sweep: the log's end goes into the error
        tail = "".join((work / "run.log").read_text().splitlines(keepends=True)[-15:])
        raise RuntimeError(f"{row} with draft.{args.key}={value} failed (exit {rc}); end of its log:\n{tail}")
    hist = [json.loads(line) for line in open(work / "run" / "metrics.jsonl")]
    record = run_record(row, args.key, value, hist)
    print(f"[draft_sweep] {row} draft.{args.key}={value}: mean AL {record['mean_acceptance_length']:.3f}", flush=True)
    return record


def run_record(row: str, key: str, value, hist: list[dict]) -> dict:
    """One run's per-step curves from its metrics.jsonl records, and the summaries the sweep compares."""
    drafted = [h for h in hist if "train/acceptance_length" in h]
    al = [h["train/acceptance_length"] for h in drafted]
    return {"row": row, key: value, "acceptance_length": al,
            "draft_loss": [h.get("train/draft_loss") for h in drafted],
            "reward": [h["train/reward"] for h in hist if "train/reward" in h],
            "rollout_time_s": [h["train/rollout_time_s"] for h in hist if "train/rollout_time_s" in h],
            "val_accuracy": [[h["step"], h["val/accuracy"]] for h in hist if "val/accuracy" in h],
            "mean_acceptance_length": mean(al),
            "first_update_al_ratio": al[1] / al[0] if len(al) > 1 and al[0] else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu-tiny", help="profile name, or a path to a profile .yaml file")
    ap.add_argument("--artifact", default="fig3", choices=["table1", "table2", "fig3", "fig4"])
    ap.add_argument("--rows", required=True, help="comma-separated row labels with a draft, e.g. EAGLE-3,DFlash")
    ap.add_argument("--key", default="lr_warmup_steps", choices=SWEEPABLE, help="the DraftSpec field to vary")
    ap.add_argument("--values", default="0,5,10", help="comma-separated values of draft.<key> to compare")
    ap.add_argument("--warm-start", default="", help="SFT warm-start folder (repro.rl.sft), the same for every run")
    ap.add_argument("--steps", type=int, default=0, help="training steps per run (0: the artifact's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once")
    ap.add_argument("--out", required=True, help="folder of sweep.json")
    args = ap.parse_args(argv)
    try:
        profile = load_run_profile(args.profile)
        values = _values(args.values, args.key)
        rows = [r.strip() for r in args.rows.split(",") if r.strip()]
        known = (profile.get(args.artifact) or {}).get("rows") or {}
        bad = [r for r in rows if r not in known or not known[r].get("draft")]
        if bad:
            raise ConfigError(f"--rows {bad} are invalid: expected rows of {args.artifact} with a draft, "
                              f"{sorted(r for r, s in known.items() if s.get('draft'))}")
        if args.warm_start and not Path(args.warm_start).is_dir():
            raise ConfigError(f"--warm-start {args.warm_start} is not a folder")
        derived = {v: derived_profile(profile, args.artifact, args.key, v, args.steps) for v in values}
        for v in values:        # every run's config, checked before the first run starts (e.g. draft.lr=0)
            for r in rows:
                run_config_from_profile(derived[v], args.artifact, r, out="unused", seed=args.seed).validate()
    except (ConfigError, ProfileError) as exc:
        print(f"draft_sweep: error: {exc}", file=sys.stderr)
        return 2
    prov = provenance({k: v for k, v in vars(args).items() if k != "out"})
    plan = [(r, v) for r in rows for v in values]
    done: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="draft_sweep_") as scratch:
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            futures = {pool.submit(run_one, args, derived[v], Path(scratch), r, v): i
                       for i, (r, v) in enumerate(plan)}
            for fut in as_completed(futures):
                done[futures[fut]] = fut.result()
                path = write_json_atomic(Path(args.out) / "sweep.json", {
                    "key": args.key, "complete": len(done) == len(plan),
                    "runs": [done[i] for i in sorted(done)], "provenance": prov})
    runs = [done[i] for i in sorted(done)]
    print(f"[draft_sweep] {len(runs)} runs -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
