"""Run one co-training row (a Table 1/2 row or a Figure 3/4 curve) on a profile, into its run folder.

Reads the row from ``experiments/profiles/<profile>.yaml`` (``rl:`` shared settings plus the
artifact's ``rows``), validates the whole config before any model is built, loads the cached SFT
warm start, trains, and logs one metrics row per step through the suite's ``MetricsLogger``
(W&B offline + metrics.jsonl). Re-running the same command after a crash resumes from the last
checkpoint in the run folder, keeping every logged step.

    python -m repro.rl.run --artifact table1 --row "Qwen3-8B/DFlash" --profile cpu-tiny \
        --warm-start results/cpu-2c/cpu-tiny/sft/dense-math --out results/cpu-2c/cpu-tiny/table1/dense-dflash
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from repro.report.metrics import MetricsLogger
from repro.report.profiles import ProfileError, load_profile
from repro.report.provenance import write_json_atomic
from repro.rl.config import ARTIFACTS, ConfigError, run_config_from_profile
from repro.rl.tokenizer import WorkloadTokenizer, build_workload_tokenizer
from repro.rl.trainer import CoTrainer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", required=True, choices=ARTIFACTS)
    ap.add_argument("--row", required=True, help="row label (a key of <artifact>.rows in the profile)")
    ap.add_argument("--profile", default="cpu-tiny")
    ap.add_argument("--out", required=True, help="run folder")
    ap.add_argument("--warm-start", default="", help="SFT warm-start folder (repro.rl.sft); empty: random init")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        prof = load_profile(args.profile)
        if prof.get("engine") == "nemo-rl":
            raise ConfigError(f"profile {args.profile!r} runs its end-to-end rows through NeMo-RL: use "
                              f"`python -m repro.nemo_rl.run --artifact {args.artifact} --row ...` instead")
        cfg = run_config_from_profile(prof, args.artifact, args.row, out=args.out, seed=args.seed,
                                      warm_start=args.warm_start)
        if args.warm_start:
            tok = WorkloadTokenizer.load(Path(args.warm_start) / "tokenizer")
        else:
            tok = build_workload_tokenizer(Path(args.out) / "tokenizer", cfg.vocab_size, args.seed)
        trainer = CoTrainer(cfg, tok)
    except (ConfigError, ProfileError, FileNotFoundError) as exc:
        print(f"run: error: {exc}", file=sys.stderr)
        return 2
    first = trainer.try_resume()
    if first:
        print(f"[{args.artifact} {args.row}] resuming at step {first}", flush=True)
    with MetricsLogger(args.out, artifact=args.artifact, profile=cfg.profile, config=cfg.to_dict(),
                       name=Path(args.out).name, resume=first > 0,
                       extra_tags=[f"row:{args.row}", f"draft:{cfg.draft.family if cfg.draft else 'none'}"]) as log:
        rows = trainer.run(log)
        probe = (prof.get(args.artifact) or {}).get("pp_probe")
        if probe and cfg.draft is not None:
            # Table 2's tap wait: the same joint update split into pipeline stages, taps over TapChannel
            from repro.rl.pp import probe_tap_wait
            for i, r in enumerate(probe_tap_wait(trainer, **probe)):
                log.log({"pp/tap_wait_s": r["tap_wait_s"], "pp/update_time_s": r["update_time_s"],
                         "pp/draft_loss": r["draft_loss"], "pp/stages": probe.get("stages", 2)},
                        row=args.row, step=cfg.steps + i)
                print(f"[{args.artifact} {args.row}] PP probe {i}: tap wait {r['tap_wait_s']:.4f}s "
                      f"update {r['update_time_s']:.3f}s", flush=True)
    # written last: the workflow's marker that this run finished (a crashed run has none and resumes)
    write_json_atomic(Path(args.out) / "run.json", {
        "artifact": args.artifact, "row": args.row, "profile": cfg.profile, "steps": cfg.steps,
        "resumed_at": first, "last": rows[-1] if rows else None, "draft_warm_start": trainer.draft_warm})
    return 0


if __name__ == "__main__":
    sys.exit(main())
