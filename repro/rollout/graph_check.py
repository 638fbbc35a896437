"""GPU smoke check of the rollout engine's CUDA-graphed draft: same tokens as eager, and how much faster.

For the profile's dense policy (``rl.policies.dense``, random init, the profile's dtype) and each draft
of ``rl.drafts`` (EAGLE-3, DFlash, DSpark; random init), ``RolloutEngine.generate`` decodes random
prompts with ``cuda_graphs="off"`` and ``"draft"``:

* greedy: the two modes give identical tokens (and, reported, whether they equal plain greedy decoding);
* sampling with one seed: identical tokens (the draft samples by one noise rule in both modes);
* timing of the sampled generate per mode (repro.bench.common.time_samples: CUDA events on a GPU;
  1 warm-up, then ``--repeats`` raw samples) and per verify step (generate time / verify forwards).

In bf16 the two modes' draft attention sums over differently laid out caches, so a near-tie can round
differently and change a proposal (and, through the verify pattern, the policy's rounding); the JSON then
names the first mismatching row and whether each mode still equals plain greedy decoding; ``--dtype
float32`` repeats the check without bf16 rounding.

A failed capture never stops the check: each graph's fallback reason is recorded (the draft then runs
eagerly on its static caches), and an error in one family is recorded and the next family runs.
Writes ``DIR/graph_check.json`` (provenance, config, samples, checks) atomically.

    python -m repro.rollout.graph_check --out results/graph_check --profile h200          # one H200
    python -m repro.rollout.graph_check --out /tmp/gc --profile cpu-tiny --batch 4 --new-tokens 8
    python -m repro.rollout.graph_check --out results/graph_check_bucketed --profile h200 --batch 60 --bucket-batch
"""
from __future__ import annotations

import argparse
import traceback
from pathlib import Path

import torch

from repro.bench.common import time_samples
from repro.report.provenance import provenance, write_json_atomic
from repro.rl.config import DraftSpec, PolicySpec, load_run_profile
from repro.rl.drafts import build_draft, make_proposer
from repro.rl.warmstart import DTYPES, make_policy
from repro.rollout.engine import RolloutEngine


def timed_generate(engine: RolloutEngine, prompts, **kw):
    """One ``generate`` timed by the project's timer (``repro.bench.common.time_samples``): (result, seconds)."""
    out = []
    (seconds,) = time_samples(lambda: out.append(engine.generate(prompts, **kw)), warmup=0, repeats=1,
                              device=engine.policy.device)
    return out[0], seconds


def first_mismatch(a: list[list[int]], b: list[list[int]]) -> dict | None:
    for r, (x, y) in enumerate(zip(a, b)):
        if x != y:
            i = next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            return {"row": r, "index": i, "rows_differing": sum(p != q for p, q in zip(a, b))}
    return None


def check_family(name: str, spec: DraftSpec, policy, prompts, args, dtype) -> dict:
    draft = build_draft(spec, policy, mask_token_id=policy.vocab_size - 1).to(dtype=dtype)
    engines = {m: RolloutEngine(policy, make_proposer(draft, spec.num_proposals), cuda_graphs=m)
               for m in ("off", "draft")}
    if args.bucket_batch:            # the static batch rounded up to a power of two, the extra rows idle
        engines["bucketed"] = RolloutEngine(policy, make_proposer(draft, spec.num_proposals), cuda_graphs="draft",
                                            bucket_batch=True)
    res: dict = {"family": spec.family, "num_proposals": spec.num_proposals, "checks": {}, "modes": {}}
    greedy = {m: e.generate(prompts, max_new_tokens=args.new_tokens, greedy=True) for m, e in engines.items()}
    plain = RolloutEngine(policy).generate(prompts, max_new_tokens=args.new_tokens, greedy=True)
    res["checks"]["greedy_identical"] = greedy["off"].tokens == greedy["draft"].tokens
    if "bucketed" in greedy:
        res["checks"]["greedy_identical_bucketed"] = greedy["bucketed"].tokens == greedy["draft"].tokens
    res["greedy_first_mismatch"] = first_mismatch(greedy["off"].tokens, greedy["draft"].tokens)
    res["greedy_equals_plain"] = {m: g.tokens == plain.tokens for m, g in greedy.items()}
    sampled = {}
    for m, e in engines.items():
        kw = {"max_new_tokens": args.new_tokens, "temperature": 1.0, "seed": args.seed}
        out, warmup = timed_generate(e, prompts, **kw)                 # warm-up (captures the graphs)
        samples, steps = [], []
        for _ in range(args.repeats):
            rep, t = timed_generate(e, prompts, **kw)
            samples.append(t)
            steps.append(t / max(rep.policy_forwards - 1, 1))
            if rep.tokens != out.tokens:
                res["checks"][f"sampling_repeatable_{m}"] = False
        res["checks"].setdefault(f"sampling_repeatable_{m}", True)
        sampled[m] = out
        res["modes"][m] = {"warmup_s": warmup, "generate_s": samples, "verify_step_s": steps,
                           "verify_steps": out.policy_forwards - 1, "counters": out.counters.as_dict(),
                           "graphs": e.graph_status()}
    res["checks"]["sampling_identical"] = sampled["off"].tokens == sampled["draft"].tokens
    if "bucketed" in sampled:
        res["checks"]["sampling_identical_bucketed"] = sampled["bucketed"].tokens == sampled["draft"].tokens
    res["sampling_first_mismatch"] = first_mismatch(sampled["off"].tokens, sampled["draft"].tokens)
    res["fallback_reasons"] = {(k if m == "draft" else f"{m}.{k}"): v["fallback_reason"]
                               for m in engines if m != "off"
                               for k, v in engines[m].graph_status().items() if v["fallback_reason"]}
    off, on = (min(res["modes"][m]["generate_s"]) for m in ("off", "draft"))
    res["speedup_draft_vs_off"] = off / on if on > 0 else None
    res["passed"] = all(res["checks"].values())
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for graph_check.json")
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--device", default="", help="default: the profile's (cuda or cpu)")
    ap.add_argument("--dtype", default="", choices=["", *DTYPES],
                    help="default: the profile's (float32 on CPU); float32 on a GPU separates a bf16 rounding "
                         "tie from a real mismatch")
    ap.add_argument("--families", default="eagle3,dflash,dspark", help="keys of the profile's rl.drafts")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=40, help="prompt lengths are drawn in [len - 8, len]")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bucket-batch", action="store_true",
                    help="also a third engine whose draft runs in a power-of-two static batch (bucket_batch); use a "
                         "--batch that is not a power of two, e.g. 60, so that rows idle")
    args = ap.parse_args(argv)
    for key in ("batch", "prompt_len", "new_tokens", "repeats"):
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    prof = load_run_profile(args.profile)
    rl = prof["rl"]
    device = args.device or ("cuda" if prof.get("hardware", {}).get("device") == "cuda" else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"profile {args.profile!r} runs on {device}, but this machine has no CUDA device "
                         "(use --profile cpu-tiny or --device cpu)")
    dtype_name = args.dtype or (prof.get("dtype", "float32") if device != "cpu" else "float32")
    dtype = DTYPES[dtype_name]
    drafts = rl.get("drafts", {})
    families = [f for f in args.families.split(",") if f]
    bad = [f for f in families if f not in drafts]
    if bad:
        raise SystemExit(f"--families {bad} are not drafts of profile {args.profile!r} (rl.drafts: {sorted(drafts)})")
    pspec = PolicySpec(**{k: v for k, v in rl["policies"]["dense"].items() if k != "mesh"})
    config = {"profile": args.profile, "device": device, "dtype": dtype_name, "policy": rl["policies"]["dense"],
              "drafts": {f: drafts[f] for f in families}, "batch": args.batch, "prompt_len": args.prompt_len,
              "new_tokens": args.new_tokens, "repeats": args.repeats, "seed": args.seed,
              "bucket_batch": args.bucket_batch}
    torch.manual_seed(args.seed)
    vocab = int(rl.get("vocab_size", 512))
    g = torch.Generator().manual_seed(args.seed)
    lens = torch.randint(max(args.prompt_len - 8, 1), args.prompt_len + 1, (args.batch,), generator=g).tolist()
    prompts = [torch.randint(0, vocab - 1, (n,), generator=g).tolist() for n in lens]   # the last id: MASK
    report = {"provenance": provenance(config), "config": config, "families": {}}
    policy = make_policy(pspec, vocab, seed=args.seed, dtype=dtype, device=device)   # each draft sets its taps
    for fam in families:
        try:
            report["families"][fam] = check_family(fam, DraftSpec(**drafts[fam]), policy, prompts, args, dtype)
        except Exception as exc:        # noqa: BLE001 - record it, run the next family
            report["families"][fam] = {"passed": False, "error": f"{type(exc).__name__}: {exc}",
                                       "traceback": traceback.format_exc()}
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        r = report["families"][fam]
        print(f"{fam}: passed={r['passed']} speedup={r.get('speedup_draft_vs_off')} "
              f"fallbacks={r.get('fallback_reasons')} error={r.get('error')}", flush=True)
    report["passed"] = all(r["passed"] for r in report["families"].values())
    path = write_json_atomic(Path(args.out) / "graph_check.json", report)
    print(f"wrote {path} (passed={report['passed']})")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
