"""Run one co-training row (a Table 1/2 row or a Figure 3/4 curve) on a profile, into its run folder.

Reads the row from ``experiments/profiles/<profile>.yaml`` (``rl:`` shared settings plus the
artifact's ``rows``), validates the whole config before any model is built, loads the cached SFT
warm start, trains, and logs one metrics row per step through the suite's ``MetricsLogger``
(W&B offline + metrics.jsonl). Re-running the same command after a crash resumes from the last
checkpoint in the run folder, keeping every logged step.

A profile whose rows run through NeMo-RL (``engine: nemo-rl``, the paper profiles) is refused unless
``--engine suite`` is given: then its ``rl:`` section's policies load the real checkpoints from
``--checkpoint-root`` and the workloads use the checkpoint's tokenizer (repro.rl.hf_tokenizer).
``--profile`` also takes a path to a profile YAML file.

    python -m repro.rl.run --artifact table1 --row "Qwen3-8B/DFlash" --profile cpu-tiny \
        --warm-start results/cpu-2c/cpu-tiny/sft/dense-math --out results/cpu-2c/cpu-tiny/table1/dense-dflash
    python -m repro.rl.run --artifact table1 --row "Qwen3-8B/DFlash" --profile paper-h100 --engine suite \
        --checkpoint-root /ckpt --out results/x/paper-h100-suite/table1/dflash
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from repro.core.io import write_json_atomic
from repro.core.metrics import MetricsLogger
from repro.core.profile import ProfileError
from repro.core.specs import ARTIFACTS, ConfigError, require_device
from repro.rl.checkpoint import drop_checkpoint
from repro.rl.config import ENGINES, check_engine, load_run_profile, run_config_from_profile
from repro.rl.hf_tokenizer import tokenizer_for_run
from repro.rl.stop import StopOnSignal, say
from repro.rl.trainer import CoTrainer

RESTART_HELP = ("a checkpoint in the run folder from another config is dropped and the run starts over, instead "
                "of refused (the workflow passes it: its reruns after a profile change regenerate the run anyway)")


def build_row(profile: str, artifact: str, row: str, *, out: str, seed: int = 0, warm_start: str = "",
              engine: str | None = None, checkpoint_root: str = "", sampling_seed: int | None = None,
              restart_on_config_change: bool = False, kv_storage=None) -> tuple[dict, CoTrainer, int]:
    """Validate a row's config, build its trainer and resume it from its run folder's last checkpoint
    (``kv_storage``: see CoTrainer). Returns (profile dict, trainer, first step still to run); raises
    ConfigError/ProfileError/FileNotFoundError."""
    prof = load_run_profile(profile)
    check_engine(prof, engine, artifact, "python -m repro.rl.run")
    cfg = run_config_from_profile(prof, artifact, row, out=out, seed=seed, warm_start=warm_start,
                                  checkpoint_root=checkpoint_root or None, sampling_seed=sampling_seed)
    require_device(cfg.device, cfg.profile)
    tok = tokenizer_for_run(cfg, out=out, seed=seed, warm_start=warm_start)
    t_build = time.perf_counter()
    trainer = CoTrainer(cfg, tok, kv_storage=kv_storage)
    built_s = time.perf_counter() - t_build
    # a recompilation logs every compiled entry's failed guard (a step's log line names only dynamo's first)
    torch._logging.set_logs(recompiles=True)
    first = trainer.try_resume(restart_on_config_change)
    if first:
        print(f"[{artifact} {row}] resuming at step {first}", flush=True)
    t_warm = time.perf_counter()
    if warmed := trainer.warm_up():
        what = (f"{warmed} request(s) up to the turns' bound" if cfg.workload.name == "workplace" else
                f"{warmed} request shape(s)")       # CoTrainer.warm_up: what its count is
        print(f"[{artifact} {row}] built in {built_s:.1f} s, then warmed the engine with {what} of steps "
              f"{first}-{cfg.steps - 1} and for the validation's in {time.perf_counter() - t_warm:.1f} s", flush=True)
    return prof, trainer, first


def row_logger(trainer: CoTrainer, first: int) -> MetricsLogger:
    cfg = trainer.cfg
    return MetricsLogger(cfg.out, artifact=cfg.artifact, profile=cfg.profile, config=cfg.to_dict(),
                         name=Path(cfg.out).name, resume_at=first or None,
                         extra_tags=[f"row:{cfg.row}", f"draft:{cfg.draft.family if cfg.draft else 'none'}"])


def run_probes(prof: dict, trainer: CoTrainer, log) -> None:
    """The artifact's after-training probe of a drafted row (pp_probe), logged after its steps."""
    cfg, section = trainer.cfg, prof.get(trainer.cfg.artifact) or {}
    if cfg.draft is None:
        return
    probe = section.get("pp_probe")
    if probe:
        # Table 2's tap wait: the same joint update split into pipeline stages, taps over TapChannel
        from repro.rl.pp import probe_tap_wait
        for i, r in enumerate(probe_tap_wait(trainer, **probe)):
            log.log({"pp/tap_wait_s": r["tap_wait_s"], "pp/update_time_s": r["update_time_s"],
                     "pp/draft_loss": r["draft_loss"], "pp/stages": probe.get("stages", 2)},
                    row=cfg.row, step=cfg.steps + i)
            print(f"[{cfg.artifact} {cfg.row}] PP probe {i}: tap wait {r['tap_wait_s']:.4f}s "
                  f"update {r['update_time_s']:.3f}s", flush=True)


def write_run_record(trainer: CoTrainer, first: int, rows: list[dict], **extra) -> None:
    """run.json, written last: the workflow's marker that this run finished (a crashed run has none and resumes)."""
    cfg = trainer.cfg
    write_json_atomic(Path(cfg.out) / "run.json", {
        "artifact": cfg.artifact, "row": cfg.row, "profile": cfg.profile, "steps": cfg.steps,
        "resumed_at": first, "last": rows[-1] if rows else None, "draft_warm_start": trainer.draft_warm, **extra})
    drop_checkpoint(cfg.out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", required=True, choices=ARTIFACTS)
    ap.add_argument("--row", required=True, help="row label (a key of <artifact>.rows in the profile)")
    ap.add_argument("--profile", default="cpu-tiny", help="profile name, or a path to a profile .yaml file")
    ap.add_argument("--engine", choices=ENGINES, default=None,
                    help="suite: run an engine: nemo-rl profile's row on the suite's own engine (its rl: section)")
    ap.add_argument("--checkpoint-root", default="",
                    help="folder holding the profile's checkpoints: (policies with a checkpoint key)")
    ap.add_argument("--out", required=True, help="run folder")
    ap.add_argument("--warm-start", default="", help="SFT warm-start folder (repro.rl.sft); empty: random init")
    ap.add_argument("--seed", type=int, default=0,
                    help="the run's seed: its prompts, init and sampling (the held-out split is every seed's)")
    ap.add_argument("--sampling-seed", type=int, default=None,
                    help="seed of sampling only (rollouts, draft anchors); prompts and the rest stay --seed's: a "
                         "baseline replica (profile key baseline_seeds)")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--restart-on-config-change", action="store_true", help=RESTART_HELP)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        prof, trainer, first = build_row(args.profile, args.artifact, args.row, out=args.out, seed=args.seed,
                                         warm_start=args.warm_start, engine=args.engine,
                                         checkpoint_root=args.checkpoint_root, sampling_seed=args.sampling_seed,
                                         restart_on_config_change=args.restart_on_config_change)
    except (ConfigError, ProfileError, FileNotFoundError) as exc:
        print(f"run: error: {exc}", file=sys.stderr)
        return 2
    with row_logger(trainer, first) as log:
        with StopOnSignal("run") as stop:
            rows = trainer.run(log, stop=stop)
        if stop.requested and trainer.last_done != trainer.cfg.steps - 1:
            say(f"run: stopped after step {trainer.last_done}, its state checkpointed in {trainer.cfg.out}")
            return stop.exit_code
        run_probes(prof, trainer, log)
    write_run_record(trainer, first, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
