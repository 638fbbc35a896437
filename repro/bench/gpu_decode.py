"""The one-GPU decode session: correctness smoke on the device, then the h200 decode benchmark.

Meant for one call on a machine with one H200 (the suite's ``run`` device); everything it measures
lands under ``$OUT`` (or ``--out``) and is copied into ``results/<hw>/h200/decode/`` afterwards:

    stage 1, smoke:  the tiny policy and drafts on the GPU (few training steps, batch 1 and 4): checks
                     that every CUDA path runs and that greedy speculative output equals plain output;
    stage 2, decode: ``repro.bench.decode`` with the ``h200`` profile (~0.4B random Qwen3 in bf16,
                     drafts briefly trained on its own greedy samples): acceptance length per family
                     and decode speedup at batch 1..64; goal speedup >= 0.6 x acceptance length at batch 1.

Each stage writes its own run folder (bench.json, metrics.jsonl, env.json); a failing stage prints
its traceback and the other still runs.

    PYTHONUNBUFFERED=1 WANDB_MODE=disabled python -m repro.bench.gpu_decode --out $OUT
    # a second call, smoke already seen passing: ~5 min with its bench.json written
    python -m repro.bench.gpu_decode --out $OUT --skip-smoke --new-tokens 64 --budget-s 240
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from repro.bench import decode

SMOKE = dict(scale="tiny", vocab_size=128, lang_tokens=120, pretrain_steps=30, pretrain_batch=16, pretrain_len=64,
             pretrain_lr=3e-3, train_prompts=32, prompt_len=8, sample_tokens=32, train_steps=20, train_batch=16,
             lr=3e-3, new_tokens=32, temperature=1.0, batch_sizes=(1, 4), repeats=2, eagle_k=3, block_size=4,
             block_layers=2)


def stage(name: str, fn) -> dict:
    t0 = time.perf_counter()
    try:
        fn()
        status = "ok"
    except Exception:  # report and go on: the other stage's numbers are still worth having
        traceback.print_exc()
        status = "failed"
    took = time.perf_counter() - t0
    print(f"== stage {name}: {status} in {took:.1f} s", flush=True)
    return {"stage": name, "status": status, "seconds": took}


def summary(folder: Path) -> None:
    bench = json.loads((folder / "bench.json").read_text())
    print(f"{'row':<16}{'tok/s':>10}{'AL':>7}{'speedup':>9}{'spd/AL':>8}")
    for r in bench["records"]:
        m = r["metrics"]
        if "tokens_per_s" in m:
            print(f"{r['row']:<16}{m['tokens_per_s']:>10.1f}{m['acceptance_length']:>7.2f}"
                  f"{m.get('speedup', 1.0):>9.2f}{m.get('speedup_over_al', float('nan')):>8.2f}")
        else:
            print(r["row"], {k: round(v, 4) for k, v in m.items()})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="One GPU session: decode smoke + h200 decode benchmark.")
    ap.add_argument("--out", type=Path, required=True, help="folder for the two run folders")
    ap.add_argument("--profile", default="h200", help="profile of stage 2 (default h200)")
    ap.add_argument("--train-steps", type=int, default=None, help="override stage 2 draft training steps")
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats per point in stage 2")
    ap.add_argument("--new-tokens", type=int, default=None, help="override stage 2 tokens per row")
    ap.add_argument("--smoke-only", action="store_true", help="run stage 1 only")
    ap.add_argument("--skip-smoke", action="store_true", help="run stage 2 only")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="stage 2 starts no new timed point after this many seconds of the whole script, so it "
                         "ends with its bench.json inside the device call's limit (default 300)")
    args = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.monotonic()
    if args.smoke_only and args.skip_smoke:
        raise SystemExit("--smoke-only and --skip-smoke exclude each other")
    report = [] if args.skip_smoke else [stage("smoke", lambda: decode.run(args.profile, args.out / "smoke", SMOKE))]
    if not args.smoke_only:
        over = {"train_steps": args.train_steps, "repeats": args.repeats, "new_tokens": args.new_tokens}
        left = args.budget_s - (time.monotonic() - t0)
        report.append(stage("decode", lambda: decode.run(args.profile, args.out / "decode", over, deadline_s=left)))
    for r in report:
        if r["status"] == "ok":
            print(f"--- {r['stage']}")
            summary(args.out / r["stage"])
    return 0 if all(r["status"] == "ok" for r in report) else 1


if __name__ == "__main__":
    sys.exit(main())
