"""Run one paper row at paper scale through NeMo-RL, or list every row and its launch command.

    python -m integrations.nemo_rl.run --artifact table1 --row Qwen3-8B/DFlash --profile paper-h100 \
        --out results/8xh100/paper-h100/table1/qwen3-8b_dflash \
        --nemo-rl-dir /path/to/RL --checkpoint-root /path/to/checkpoints --hf-home /path/to/hf [--dry-run]
    python -m integrations.nemo_rl.run --list [--profile paper-gb200]

Into the run folder (--out) it writes the NeMo-RL config (nemo_rl_config.yaml) and env.json (engine
nemo-rl, artifact, profile, row, provenance), then launches NeMo-RL with W&B writing into the run
folder (WANDB_DIR, project/group/tags as the suite's logger), where ``snakemake collect`` reads it;
when NeMo-RL exits 0 it adds the suite's per-step metrics.jsonl and, last, run.json (integrations.nemo_rl.finish).
Before writing anything it checks what the row needs on disk (checkout and its co-training stack,
checkpoints, datasets) and checks the generated config against the keys and types of the checkout's
own example configs; before launching, what this machine needs (GPUs for a local run, uv, sbatch).
  --config-only   write the config and env.json, launch nothing (launch NeMo-RL yourself)
  --dry-run       write the config, print the launch command, launch nothing (no env.json, so
                  collect does not see a run that never ran); machine problems are printed, not fatal
  --launcher      local (default for one-node rows: ``uv run`` in the checkout) or ray-sub (default
                  for multi-node rows: NeMo-RL's ray.sub through ``sbatch --wait``)
  --layout        paper (default) or upstream-today: PP = CP = 1, sequence packing off, the layout the
                  PR 3713 head runs now; NOT the paper's layout, and labelled so (config header, env.json,
                  W&B tags and name)
Every generated config is validated by the checkout itself before it is kept: NeMo-RL's load_config and
MasterConfig through the checkout's ``uv run``, plus every policy.draft key against its DraftConfig
(integrations.nemo_rl.upstream); --no-upstream-check skips that (the header then says so).
Paths and SLURM settings may also come from the environment (--help names the variables).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from integrations.nemo_rl import checks, config, launch, skeleton, upstream
from integrations.nemo_rl.finish import finish
from integrations.nemo_rl.rows import (
    ARTIFACTS,
    LAYOUTS,
    PAPER_LAYOUT,
    RowError,
    RowSpec,
    load_rows,
    resolve,
    with_layout,
)
from repro.core.io import write_json_atomic
from repro.core.metrics import wandb_mode
from repro.core.profile import ProfileError, load_profile
from repro.core.provenance import git_state, provenance

ENGINE = "nemo-rl"
PAPER_PROFILES = ("paper-h100", "paper-gb200")


def run_slug(row: str) -> str:
    """A row's run folder name, as the workflow names it: ``Qwen3-8B/no draft`` -> ``qwen3-8b_no_draft``."""
    return re.sub(r"[^a-z0-9.-]+", "_", row.lower()).strip("_")


def check_against_checkout(cfg: dict[str, Any], spec: RowSpec, nemo: Path) -> None:
    """The generated config against the skeleton of the user's own checkout (its example configs and
    DraftConfig): a key NeMo-RL would silently ignore is an error here."""
    examples = (spec.workload.example,) + ((skeleton.EAGLE3_RECIPE,) if spec.family else ())
    sha = git_state(nemo)["sha"]
    skel = skeleton.record(nemo, sha, examples=examples)
    skeleton.check(config.without_overrides(cfg, spec), skel, list(examples))


def validated_config(cfg: dict[str, Any], spec: RowSpec, run_dir: Path, nemo: Path, upstream_check: bool,
                     timeout_s: float) -> Path:
    """Write the config where NeMo-RL reads it, once the checkout's own loader and MasterConfig (and the
    strict DraftConfig key check) accept it; a rejected config is left beside it as *.rejected.yaml."""
    sha = git_state(nemo)["sha"]
    if not upstream_check:
        return config.write_config(cfg, spec, run_dir, f"the example configs' keys of the NeMo-RL checkout {nemo} "
                                   f"(commit {sha}); NOT validated by its MasterConfig (--no-upstream-check)")
    trial = config.write_config(cfg, spec, run_dir, "nothing yet", name=config.TRIAL_NAME)
    try:
        upstream.check_in_checkout([trial], nemo, timeout_s)
    except upstream.UpstreamError:
        trial.replace(run_dir / config.REJECTED_NAME)
        raise
    trial.unlink()
    return config.write_config(cfg, spec, run_dir, f"NeMo-RL's load_config + MasterConfig and DraftConfig of "
                               f"the checkout {nemo} (commit {sha}), run in its environment")


def write_env(run_dir: Path, spec: RowSpec, paths: config.Paths, launcher: str, cmd: str) -> Path:
    """env.json as the suite's MetricsLogger writes it, plus engine and row, which collect reads."""
    run_cfg = {"row": spec.row, "launcher": launcher, "command": cmd, "layout": spec.layout_name,
               "nemo_rl_config": str(run_dir / config.CONFIG_NAME),
               "nemo_rl_commit": git_state(paths.nemo_rl_dir)["sha"] if paths.nemo_rl_dir else None}
    prov = provenance(run_cfg)
    tags = config.wandb_names(spec)["tags"]
    return write_json_atomic(run_dir / "env.json", {
        "artifact": spec.artifact, "profile": spec.profile, "run": run_dir.name, "row": spec.row,
        "engine": ENGINE, "layout": spec.layout_name, "paper_layout": spec.is_paper_layout, "wandb_mode": wandb_mode(),
        "tags": tags, **prov})


def fresh_start(run_dir: Path, spec: RowSpec) -> None:
    """Before a launch: drop the previous run's marker and sidecar; without checkpoints (the timing
    tables) NeMo-RL starts again from step 1, so its old W&B logs go too (with checkpoints it resumes,
    and collect lets the later log win per step)."""
    for name in ("run.json", "metrics.jsonl"):
        (run_dir / name).unlink(missing_ok=True)
    if not spec.checkpointing:
        shutil.rmtree(run_dir / config.LOG_DIR_NAME, ignore_errors=True)


def list_rows(profiles: list[str], paths: config.Paths, out_root: Path, layout: str = PAPER_LAYOUT) -> int:
    for name in profiles:
        for artifact, rows in load_rows(load_profile(name)).items():
            for row, spec in rows.items():
                spec = with_layout(spec, layout)
                lay, launcher = spec.layout, launch.default_launcher(spec)
                suffix = "" if spec.is_paper_layout else f"__{layout}"
                run_dir = out_root / name / artifact / (run_slug(row) + suffix)
                what = spec.family.name if spec.family else f"no draft (baseline of {artifact})"
                base = f", baseline {spec.baseline_row!r}" if spec.baseline_row else ""
                print(f"[{name}] {artifact} {row!r}: {spec.model}, {what}{base}; "
                      f"TP/PP/CP/EP {lay.tp}/{lay.pp}/{lay.cp}/{lay.ep} on {lay.nodes}x{lay.gpus_per_node} GPUs; "
                      f"{spec.workload.name}, {spec.max_num_steps} steps")
                print(f"  {launch.command(spec, paths, run_dir, launcher)}")
    return 0


def _env_path(name: str) -> Path | None:
    return Path(os.environ[name]) if os.environ.get(name) else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--list", action="store_true", help="print every row and its launch command")
    ap.add_argument("--artifact", choices=ARTIFACTS)
    ap.add_argument("--row", help="the paper row, e.g. 'Qwen3-8B/DFlash' (table1) or 'DSpark' (table2)")
    ap.add_argument("--profile", choices=PAPER_PROFILES)
    ap.add_argument("--out", type=Path, help="the run folder")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--config-only", action="store_true")
    # Each path or SLURM setting may also come from the environment (a Snakemake SLURM job inherits it).
    ap.add_argument("--nemo-rl-dir", type=Path, default=_env_path("NEMO_RL_DIR"),
                    help="your NeMo-RL checkout, with the co-training stack (default: $NEMO_RL_DIR)")
    ap.add_argument("--checkpoint-root", type=Path, default=_env_path("REPRO_CHECKPOINT_ROOT"),
                    help="folder holding the profile's checkpoints (default: $REPRO_CHECKPOINT_ROOT)")
    ap.add_argument("--hf-home", type=Path, default=_env_path("HF_HOME"),
                    help="Hugging Face cache holding DAPO-Math-17K and AIME 2024 (default: $HF_HOME)")
    ap.add_argument("--dataset-root", type=Path, default=_env_path("REPRO_DATASET_ROOT"),
                    help="folder holding workplace_assistant/{train,validation}.jsonl (default: $REPRO_DATASET_ROOT)")
    ap.add_argument("--launcher", choices=launch.LAUNCHERS, help="default: local for 1 node, ray-sub for more")
    ap.add_argument("--layout", choices=LAYOUTS, default=PAPER_LAYOUT,
                    help="paper (default), or upstream-today: PP = CP = 1 unpacked, not the paper's layout")
    ap.add_argument("--no-upstream-check", action="store_true",
                    help="skip validating the config with the checkout's own load_config + MasterConfig")
    ap.add_argument("--upstream-timeout", type=float, default=upstream.DEFAULT_TIMEOUT_S,
                    help="seconds the checkout's `uv run` may take (its first run syncs the environment)")
    ap.add_argument("--container", default=os.environ.get("REPRO_NEMO_RL_CONTAINER"),
                    help="ray-sub: the NeMo-RL container image (default: $REPRO_NEMO_RL_CONTAINER)")
    ap.add_argument("--slurm-account", default=os.environ.get("REPRO_SLURM_ACCOUNT"),
                    help="ray-sub: sbatch --account (default: $REPRO_SLURM_ACCOUNT)")
    ap.add_argument("--slurm-partition", default=os.environ.get("REPRO_SLURM_PARTITION"),
                    help="ray-sub: sbatch --partition (default: $REPRO_SLURM_PARTITION)")
    ap.add_argument("--slurm-time", default=launch.Slurm.time,
                    help=f"ray-sub: sbatch --time (default {launch.Slurm.time})")
    args = ap.parse_args(argv)
    if not args.list:
        missing = [f"--{k.replace('_', '-')}" for k in ("artifact", "row", "profile", "out") if not getattr(args, k)]
        if missing:
            ap.error(f"missing {', '.join(missing)} (or use --list)")
    if args.dry_run and args.config_only:
        ap.error("--dry-run and --config-only exclude each other")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def absolute(path: Path | None) -> Path | None:
        return path.resolve() if path is not None else None

    paths = config.Paths(nemo_rl_dir=absolute(args.nemo_rl_dir), checkpoint_root=absolute(args.checkpoint_root),
                         hf_home=absolute(args.hf_home), dataset_root=absolute(args.dataset_root))
    slurm = launch.Slurm(container=args.container, account=args.slurm_account, partition=args.slurm_partition,
                         time=args.slurm_time)
    try:
        if args.list:
            return list_rows([args.profile] if args.profile else list(PAPER_PROFILES), paths,
                             args.out or Path("results") / "<hw>", args.layout)
        spec = with_layout(resolve(args.profile, args.artifact, args.row), args.layout)
        profile = load_profile(args.profile)
        if wandb_mode() == "disabled":
            raise checks.CheckError("WANDB_MODE=disabled: NeMo-RL runs are collected from their W&B logs; "
                                    "use offline (the default) or online")
        launcher = args.launcher or launch.default_launcher(spec)
        if launcher == "ray-sub" and not (args.dry_run or args.config_only):
            missing = [f"--slurm-{k}" for k in ("account", "partition") if not getattr(slurm, k)]
            if missing:
                raise checks.CheckError(f"ray-sub launch needs {', '.join(missing)} (ray.sub's own #SBATCH "
                                        "account and partition lines are placeholders)")
        on_disk, here = checks.problems(spec, profile, paths, launcher, container=slurm.container)
        if on_disk:
            raise checks.CheckError(checks.describe(spec, launcher, on_disk))
        run_dir = args.out.resolve()
        cfg = config.build_config(spec, paths, run_dir)
        check_against_checkout(cfg, spec, paths.nemo_rl_dir)
        cmd = launch.command(spec, paths, run_dir, launcher, slurm)
        written = validated_config(cfg, spec, run_dir, paths.nemo_rl_dir, not args.no_upstream_check,
                                   args.upstream_timeout)
        if args.dry_run:
            print(f"# {written}")
            print(cmd)
            if here:
                print(f"note: launching here would fail: {checks.describe(spec, launcher, here)}", file=sys.stderr)
            return 0
        if here and not args.config_only:
            raise checks.CheckError(checks.describe(spec, launcher, here))
        write_env(run_dir, spec, paths, launcher, cmd)
        if args.config_only:
            print(f"wrote {written} and {run_dir / 'env.json'}; launch with:\n{cmd}")
            return 0
        fresh_start(run_dir, spec)
        print(cmd, flush=True)
        done = subprocess.run(["bash", "-c", cmd], env={**os.environ, "WANDB_DIR": str(run_dir)}, check=False)
        if done.returncode != 0:
            print(f"integrations.nemo_rl.run: NeMo-RL exited with {done.returncode}; no run.json written",
                  file=sys.stderr)
            return done.returncode
        print(f"wrote {finish(run_dir, done.returncode)}")
        return 0
    except (RowError, ProfileError, checks.CheckError, skeleton.SkeletonError, upstream.UpstreamError, ValueError,
            OSError) as exc:
        print(f"integrations.nemo_rl.run: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
