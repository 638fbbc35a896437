"""Does speculative rollout draw plain sampling's completions *on the real workload*? A two-sample check, per draft
family, of the rollout engine with the family's draft against the same engine without one.

``repro.bench.cotrain_checks``'s law check proves the sampler exact against an enumerable law: a 12-token policy,
three-token completions, no stop token, one prompt. This check covers what that one cannot: the workload's
vocabulary, prompts of many lengths, completions that stop at EOS or at ``max_new_tokens``, rows that finish while
others decode, and the warm-start policy and drafts (so proposals are accepted as often as in training).

Every arm (``none``, then each family) loads the same warm start and decodes the same prompts: call ``c`` draws
``--prompts`` training problems (draw ``c``) times ``--group`` completions, sampling seed ``seed + c``. The arms take
calls in turn until ``--budget-s`` or ``--calls``, so each arm gets the same calls. Per completion it records the
reward (DAPO's rule), the length, and the mean log-probability of its tokens under one common scorer: the ``none``
arm's rollout policy run teacher-forced (``forward_train``), so both arms' tokens are judged by the same numbers
and a difference can come only from which tokens were drawn. Per family against ``none``:

* reward, mean token log-probability and length: difference of means, its standard error stratified by prompt, a
  two-sided normal p-value;
* the law of the length: a two-sample chi-square (EOS and ``max_new_tokens`` handling).

A family passes when every p-value exceeds ``--alpha``. Under exact speculative sampling the two arms' completions
have one law; a sampler that favours the draft's tokens, mishandles a stop, or reads a stale proposal distribution
moves the log-probability first (it is the most sensitive of the statistics). Writes ``OUT/workload_law.json``
(provenance, config, per arm and family: means, differences, p-values, acceptance lengths) atomically.

    python -m repro.bench.workload_law --out $OUT/wl --profile h200 --warm-start .cache/sft_job0/dense-math-<hash>
    python -m repro.bench.workload_law --out /tmp/wl --profile cpu-tiny \\
        --warm-start results/cpu-2c/cpu-tiny/sft/dense-math --prompts 4 --group 16 --calls 2      # CPU, ~1 min
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

from repro.bench.cotrain_checks import FAMILIES, _device, _release_device_memory
from repro.report.provenance import provenance, write_json_atomic
from repro.rl.config import load_run_profile, run_config_from_profile
from repro.rl.episodes import RolloutBatch, math_rollout
from repro.rl.grpo import token_logprobs
from repro.rl.hf_tokenizer import tokenizer_for_run
from repro.rl.trainer import CoTrainer
from repro.rollout.law import two_sample_chi2_pvalue

STATISTICS = ("reward", "token_logprob", "length")


def _rows(prof: dict, artifact: str, families: list[str]) -> dict[str, str]:
    """The artifact's row per arm: ``none`` (its no-draft row) and each family's row."""
    rows = prof[artifact]["rows"]
    by_family = {(s or {}).get("draft"): r for r, s in rows.items() if (s or {}).get("draft")}
    missing = [f for f in families if f not in by_family]
    if missing:
        raise ValueError(f"{artifact} has no row with draft(s) {missing}; its drafted rows: {sorted(by_family)}")
    base = next(r for r, s in rows.items() if not (s or {}).get("draft"))
    return {"none": base, **{f: by_family[f] for f in families}}


@torch.no_grad()
def score(scorer, batch: RolloutBatch, temperature: float, chunk: int = 256) -> torch.Tensor:
    """Mean log-probability of each row's policy-written tokens under ``scorer``, teacher-forced: ``[B]``."""
    dev = next(scorer.model.parameters()).device
    out = []
    for i in range(0, batch.size, chunk):
        ids = batch.input_ids[i:i + chunk].to(dev)
        att = batch.attention_mask[i:i + chunk].to(dev)
        mask = batch.loss_mask[i:i + chunk].to(dev)
        logits = scorer.forward_train(ids, want_taps=False, attention_mask=att).logits
        lp = token_logprobs(logits, ids, temperature) * mask
        out.append((lp.sum(1) / mask.sum(1).clamp_min(1)).double().cpu())
    return torch.cat(out)


def stratified_difference(a: torch.Tensor, b: torch.Tensor, strata: torch.Tensor) -> dict:
    """Difference of means of ``a`` and ``b`` (same strata layout, e.g. prompt per row), its standard error from
    the within-stratum variances, and the two-sided normal p-value of zero difference."""
    diff, var, n = 0.0, 0.0, len(a)
    for s in strata.unique():
        xa, xb = a[strata == s].double(), b[strata == s].double()
        w = len(xa) / n
        diff += w * float(xa.mean() - xb.mean())
        va = float(xa.var()) if len(xa) > 1 else 0.0
        vb = float(xb.var()) if len(xb) > 1 else 0.0
        var += w * w * (va / len(xa) + vb / len(xb))
    se = math.sqrt(var)
    z = diff / se if se > 0 else (0.0 if diff == 0 else math.inf)
    return {"difference": diff, "se": se, "z": z, "p": math.erfc(abs(z) / math.sqrt(2))}


def workload_law(prof: dict, artifact: str, families: list[str], *, warm_start: str, prompts: int, group: int,
                 calls: int, budget_s: float, alpha: float, seed: int, workdir: Path) -> dict:
    rows = _rows(prof, artifact, families)
    trainers = {}
    for arm, row in rows.items():
        cfg = run_config_from_profile(prof, artifact, row, out=str(workdir / arm), seed=0, warm_start=warm_start)
        trainers[arm] = CoTrainer(cfg, tokenizer_for_run(cfg, out=workdir / "tok", seed=0, warm_start=warm_start))
    base = trainers["none"]
    if base.cfg.workload.name != "math":
        raise ValueError(f"{artifact}'s workload is {base.cfg.workload.name!r}; this check samples the math workload")
    g = base.cfg.grpo
    scorer = base.rollout_policy
    per_arm = {arm: {"reward": [], "token_logprob": [], "length": [], "prompt": [], "accepted": 0, "verify": 0}
               for arm in rows}
    t0, done = time.perf_counter(), 0
    while done < calls and (done == 0 or time.perf_counter() - t0 < budget_s):
        items = base.math.problems("train", prompts, draw=done)
        for arm, tr in trainers.items():
            b = math_rollout(tr.engine, tr.tok, items, group_size=group, max_new_tokens=g.max_new_tokens,
                             temperature=g.temperature, seed=seed * 1_000_003 + done)
            rec = per_arm[arm]
            rec["reward"].append(b.rewards.double())
            rec["token_logprob"].append(score(scorer, b, g.temperature))
            rec["length"].append(b.loss_mask.sum(1).double())
            rec["prompt"].append(torch.arange(prompts).repeat_interleave(group) + done * prompts)
            rec["accepted"] += b.counters.accepted
            rec["verify"] += b.counters.verify_steps
        done += 1
        print(f"[workload_law] call {done}: {sum(len(r) for r in per_arm['none']['reward'])} completions per arm, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    data = {arm: {k: torch.cat(v) for k, v in rec.items() if isinstance(v, list)} for arm, rec in per_arm.items()}
    out: dict = {"artifact": artifact, "rows": rows, "calls": done, "completions_per_arm": len(data["none"]["reward"]),
                 "prompts_per_call": prompts, "group": group, "temperature": g.temperature,
                 "max_new_tokens": g.max_new_tokens, "seconds": time.perf_counter() - t0, "arms": {}, "families": {}}
    for arm, d in data.items():
        rec = per_arm[arm]
        out["arms"][arm] = {**{s: float(d[s].mean()) for s in STATISTICS},
                            "hit_max_new_tokens": float((d["length"] >= g.max_new_tokens).double().mean()),
                            "acceptance_length": 1 + rec["accepted"] / rec["verify"] if rec["verify"] else None}
    ref = data["none"]
    top = int(g.max_new_tokens) + 1
    for fam in families:
        d = data[fam]
        res = {s: stratified_difference(d[s], ref[s], ref["prompt"]) for s in STATISTICS}
        res["length_law_p"] = two_sample_chi2_pvalue(torch.bincount(d["length"].long(), minlength=top),
                                                     torch.bincount(ref["length"].long(), minlength=top))
        res["passed"] = min([res[s]["p"] for s in STATISTICS] + [res["length_law_p"]]) > alpha
        out["families"][fam] = res
        print(f"[workload_law] {fam}: " + ", ".join(f"{s} {res[s]['difference']:+.4g} (p {res[s]['p']:.3g})"
                                                    for s in STATISTICS)
              + f", length law p {res['length_law_p']:.3g}", flush=True)
    out["passed"] = all(f["passed"] for f in out["families"].values())
    del trainers, base, scorer
    _release_device_memory()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", required=True, type=Path, help="folder for workload_law.json")
    ap.add_argument("--profile", default="h200", help="profile name or .yaml file (default h200)")
    ap.add_argument("--artifact", default="fig3", help="the artifact whose rows (policy, drafts, sampling) are used")
    ap.add_argument("--warm-start", required=True, help="SFT warm-start folder (policy.pt and the drafts' weights)")
    ap.add_argument("--families", default=",".join(FAMILIES), help="keys of the profile's rl.drafts")
    ap.add_argument("--prompts", type=int, default=16, help="training problems per call")
    ap.add_argument("--group", type=int, default=64, help="completions per problem per call")
    ap.add_argument("--calls", type=int, default=1000, help="at most this many calls per arm")
    ap.add_argument("--budget-s", type=float, default=120.0, help="no call starts after this many seconds")
    ap.add_argument("--alpha", type=float, default=1e-3, help="a family fails when any p-value is below this")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    for name in ("prompts", "group", "calls"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} {getattr(args, name)}: expected a positive integer")
    if args.budget_s <= 0:
        ap.error(f"--budget-s {args.budget_s}: expected a positive number of seconds")
    if not 0 < args.alpha < 1:
        ap.error(f"--alpha {args.alpha}: expected a level between 0 and 1")
    if not (Path(args.warm_start) / "policy.pt").is_file():
        ap.error(f"--warm-start {args.warm_start!r}: no policy.pt there; build it with the workflow's SFT "
                 "(e.g. snakemake -c2 fig3) or scripts/device/warm_sft.sh")
    prof = load_run_profile(args.profile)
    bad = [f for f in families if f not in prof["rl"]["drafts"]]
    if not families or bad:
        ap.error(f"--families {args.families!r}: expected some of {sorted(prof['rl']['drafts'])}")
    if args.artifact not in prof:
        ap.error(f"--artifact {args.artifact!r}: profile {args.profile!r} has no such section")
    _device(prof)
    with tempfile.TemporaryDirectory(prefix="workload_law_") as tmp:
        report = workload_law(prof, args.artifact, families, warm_start=args.warm_start, prompts=args.prompts,
                              group=args.group, calls=args.calls, budget_s=args.budget_s, alpha=args.alpha,
                              seed=args.seed, workdir=Path(tmp))
    report["provenance"] = provenance({k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()})
    path = write_json_atomic(args.out / "workload_law.json", report)
    print(f"workload_law: passed={report['passed']} -> {path}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
