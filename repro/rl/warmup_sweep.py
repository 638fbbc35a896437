"""How the draft's learning-rate warm-up (``draft.lr_warmup_steps``) changes co-training's acceptance length.

For each row and each warm-up, one co-training run of the artifact (``repro.rl.run``, from the same SFT warm start
and seed, so the runs differ only in the draft's learning rate) in a scratch folder; ``sweep.json`` gets each run's
acceptance length, draft loss and reward per step, the mean acceptance length and the first update's drop
(AL at step 1 over step 0), with provenance. The run folders stay out of ``results/`` (their env.json would join
the artifact's own report).

    python -m repro.rl.warmup_sweep --profile cpu-tiny --artifact fig3 --rows EAGLE-3,DFlash,DSpark \\
        --warmups 0,5,10,20 --warm-start results/cpu-2c/cpu-tiny/sft/dense-math --steps 16 \\
        --out results/cpu-2c/cpu-tiny/draft_warmup
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean

import yaml

from repro.report.profiles import ProfileError
from repro.report.provenance import provenance, write_json_atomic
from repro.rl.config import ConfigError, load_run_profile
from repro.rl.summary import run_dir_name


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--{what} {text!r} is invalid: expected comma-separated integers, e.g. 0,5,10") from None
    if not vals or any(v < 0 for v in vals):
        raise ConfigError(f"--{what} {text!r} is invalid: expected integers >= 0")
    return vals


def derived_profile(profile: dict, artifact: str, warmup: int, steps: int) -> dict:
    """The profile with every draft's ``lr_warmup_steps`` set to ``warmup`` (and the artifact's steps)."""
    prof = json.loads(json.dumps(profile))
    for spec in prof["rl"]["drafts"].values():
        spec["lr_warmup_steps"] = warmup
    if steps:
        prof[artifact]["steps"] = steps
    return prof


def run_one(args, profile: dict, scratch: Path, row: str, warmup: int) -> dict:
    work = scratch / f"{run_dir_name(row)}-w{warmup}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "profile.yaml").write_text(yaml.safe_dump(derived_profile(profile, args.artifact, warmup, args.steps),
                                                      sort_keys=False))
    cmd = [sys.executable, "-m", "repro.rl.run", "--artifact", args.artifact, "--row", row,
           "--profile", str(work / "profile.yaml"), "--out", str(work / "run"), "--seed", str(args.seed),
           "--threads", str(args.threads)] + (["--warm-start", args.warm_start] if args.warm_start else [])
    with open(work / "run.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc:
        raise RuntimeError(f"{row} with warm-up {warmup} failed (exit {rc}): see {work / 'run.log'}")
    hist = [json.loads(line) for line in open(work / "run" / "metrics.jsonl")]
    al = [h["train/acceptance_length"] for h in hist if "train/acceptance_length" in h]
    print(f"[warmup_sweep] {row} warm-up {warmup}: mean AL {mean(al):.3f}", flush=True)
    return {"row": row, "lr_warmup_steps": warmup, "acceptance_length": al,
            "draft_loss": [h.get("train/draft_loss") for h in hist if "train/acceptance_length" in h],
            "reward": [h["train/reward"] for h in hist if "train/reward" in h],
            "mean_acceptance_length": mean(al),
            "first_update_al_ratio": al[1] / al[0] if len(al) > 1 and al[0] else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu-tiny", help="profile name, or a path to a profile .yaml file")
    ap.add_argument("--artifact", default="fig3", choices=["table1", "table2", "fig3", "fig4"])
    ap.add_argument("--rows", required=True, help="comma-separated row labels with a draft, e.g. EAGLE-3,DFlash")
    ap.add_argument("--warmups", default="0,5,10", help="comma-separated lr_warmup_steps values to compare")
    ap.add_argument("--warm-start", default="", help="SFT warm-start folder (repro.rl.sft), the same for every run")
    ap.add_argument("--steps", type=int, default=0, help="training steps per run (0: the artifact's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once")
    ap.add_argument("--out", required=True, help="folder of sweep.json")
    args = ap.parse_args(argv)
    try:
        profile = load_run_profile(args.profile)
        warmups = _ints(args.warmups, "warmups")
        rows = [r.strip() for r in args.rows.split(",") if r.strip()]
        known = (profile.get(args.artifact) or {}).get("rows") or {}
        bad = [r for r in rows if r not in known or not known[r].get("draft")]
        if bad:
            raise ConfigError(f"--rows {bad} are invalid: expected rows of {args.artifact} with a draft, "
                              f"{sorted(r for r, s in known.items() if s.get('draft'))}")
        if args.warm_start and not Path(args.warm_start).is_dir():
            raise ConfigError(f"--warm-start {args.warm_start} is not a folder")
    except (ConfigError, ProfileError) as exc:
        print(f"warmup_sweep: error: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="warmup_sweep_") as scratch:
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            runs = list(pool.map(lambda rw: run_one(args, profile, Path(scratch), *rw),
                                 [(r, w) for r in rows for w in warmups]))
    config = {k: v for k, v in vars(args).items() if k != "out"}
    path = write_json_atomic(Path(args.out) / "sweep.json", {"runs": runs, "provenance": provenance(config)})
    print(f"[warmup_sweep] {len(runs)} runs -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
