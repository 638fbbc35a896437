"""Does speculative rollout draw plain sampling's completions *on the real workload*? A two-sample check, per draft
family, of the rollout engine with the family's draft against the same engine without one.

``repro.bench.cotrain_checks``'s law check proves the sampler exact against an enumerable law: a 12-token policy,
three-token completions, no stop token, one prompt. This check covers what that one cannot: the workload's
vocabulary, prompts of many lengths, completions that stop at EOS or at ``max_new_tokens``, rows that finish while
others decode, and the warm-start policy and drafts (so proposals are accepted as often as in training).

Every arm (``none``, then each family) loads the same warm start and decodes the same prompts: call ``c`` draws
``--prompts`` training problems (draw ``c``) times ``--group`` completions, sampling seed ``seed * 1000003 + c``.
The arms run one after another, one trainer on the device at a time: ``none`` makes calls for its share of
``--budget-s`` (at most ``--calls``), and each family then makes the same calls. Per completion it records the
reward (DAPO's rule), the length, and the mean log-probability of its tokens under the arm's rollout policy run
teacher-forced (``forward_train``); every arm loads the same warm start, so all arms' tokens are judged by the same
weights and the same computation, and a difference can come only from which tokens were drawn. Per family against ``none``:

* reward, mean token log-probability and length: difference of means, its standard error stratified by prompt, a
  two-sided normal p-value;
* the law of the length: a two-sample chi-square (EOS and ``max_new_tokens`` handling).

A family passes when every p-value exceeds ``--alpha``. Under exact speculative sampling the two arms' completions
have one law; a sampler that favours the draft's tokens, mishandles a stop, or reads a stale proposal distribution
moves the log-probability first (it is the most sensitive of the statistics). Writes ``OUT/workload_law.json``
(provenance, config, per arm and family: means, differences, p-values, acceptance lengths) atomically after every
arm (``complete: false`` until the last), so a run stopped by a time limit keeps the arms it finished.

    python -m repro.bench.workload_law --out $OUT/wl --profile h200 --warm-start .cache/sft_job0/dense-math-<hash>
    python -m repro.bench.workload_law ... --from-run <a fig3 EAGLE-3 run folder>     # the trained policy and draft
    python -m repro.bench.workload_law --out /tmp/wl --profile cpu-tiny \\
        --warm-start results/cpu-2c/cpu-tiny/sft/dense-math --prompts 4 --group 16 --calls 2      # CPU, ~1 min
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from repro.bench.cotrain_checks import FAMILIES, _release_device_memory, checked_profile, family_rows
from repro.report.provenance import provenance, write_json_atomic
from repro.rl.checkpoint import CKPT
from repro.rl.config import run_config_from_profile
from repro.rl.episodes import RolloutBatch, math_rollout
from repro.rl.grpo import token_logprobs
from repro.rl.hf_tokenizer import tokenizer_for_run
from repro.rl.trainer import CoTrainer
from repro.rollout.law import two_sample_chi2_pvalue

STATISTICS = ("reward", "token_logprob", "length")


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


def _sample_arm(tr: CoTrainer, *, prompts: int, group: int, calls: int, budget_s: float, seed: int) -> dict:
    """One arm's completions: call ``c`` decodes training draw ``c`` (``prompts`` problems x ``group``) with
    sampling seed ``seed * 1_000_003 + c``; stops after ``calls`` calls or, past the first, ``budget_s``. The
    scorer is the arm's own rollout policy: every arm loads the same warm start, so all score alike."""
    g = tr.cfg.grpo
    rec: dict = {"reward": [], "token_logprob": [], "length": [], "prompt": [], "accepted": 0, "verify": 0}
    t0, done = time.perf_counter(), 0
    while done < calls and (done == 0 or time.perf_counter() - t0 < budget_s):
        items = tr.math.problems("train", prompts, draw=done)
        b = math_rollout(tr.engine, tr.tok, items, group_size=group, max_new_tokens=g.max_new_tokens,
                         temperature=g.temperature, seed=seed * 1_000_003 + done)
        rec["reward"].append(b.rewards.double())
        rec["token_logprob"].append(score(tr.rollout_policy, b, g.temperature))
        rec["length"].append(b.loss_mask.sum(1).double())
        rec["prompt"].append(torch.arange(prompts).repeat_interleave(group) + done * prompts)
        rec["accepted"] += b.counters.accepted
        rec["verify"] += b.counters.verify_steps
        done += 1
        print(f"[workload_law]   call {done} (at most {calls}): "
              f"{done * prompts * group} completions, {time.perf_counter() - t0:.0f} s", flush=True)
    data = {k: torch.cat(v) for k, v in rec.items() if isinstance(v, list)}
    data.update(calls=done, seconds=time.perf_counter() - t0,
                acceptance_length=1 + rec["accepted"] / rec["verify"] if rec["verify"] else None)
    return data


def compare(fam: dict, ref: dict, *, max_new_tokens: int, alpha: float) -> dict:
    """A family's completions against the no-draft arm's: each statistic's stratified difference and the length
    law's two-sample chi-square; ``passed`` when every p-value exceeds ``alpha``."""
    res = {s: stratified_difference(fam[s], ref[s], ref["prompt"]) for s in STATISTICS}
    top = int(max_new_tokens) + 1
    res["length_law_p"] = two_sample_chi2_pvalue(torch.bincount(fam["length"].long(), minlength=top),
                                                 torch.bincount(ref["length"].long(), minlength=top))
    res["passed"] = min([res[s]["p"] for s in STATISTICS] + [res["length_law_p"]]) > alpha
    return res


def load_run_state(run_dir: str | Path) -> dict:
    """A co-training run's last checkpoint (``repro.rl.checkpoint``): its step, its policy, its draft and the
    draft's family."""
    path = Path(run_dir) / CKPT
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no checkpoint {CKPT} there (a run folder of repro.rl.run is expected)")
    state = torch.load(path, map_location="cpu", weights_only=False)
    draft = (state.get("config") or {}).get("draft") or {}
    return {"path": str(path), "step": int(state["step"]), "policy": state["policy"], "draft": state.get("draft"),
            "draft_family": draft.get("family")}


def _load_state(tr: CoTrainer, run: dict) -> bool:
    """The run's policy into ``tr`` (and its draft when ``tr``'s draft is of the run's family), pushed to the
    rollout engine; returns whether the draft was loaded."""
    tr.policy.model.load_state_dict(run["policy"])
    loaded = tr.draft is not None and run["draft"] is not None and tr.cfg.draft.family == run["draft_family"]
    if loaded:
        tr.draft.load_state_dict(run["draft"])
    tr.push()
    return loaded


def workload_law(prof: dict, artifact: str, families: list[str], *, warm_start: str, prompts: int, group: int,
                 calls: int, budget_s: float, alpha: float, seed: int, workdir: Path, from_run: str = "",
                 progress: Callable[[dict], None] | None = None) -> dict:
    """The arms one after another (one trainer on the device at a time): ``none`` samples for its share of
    ``budget_s``, each family then takes the same calls. ``progress`` gets the report after every arm. With
    ``from_run``, every arm starts from that run's checkpoint instead: its policy, and its draft for its family
    (the other families keep their warm-start drafts: the sampler must be exact for any draft)."""
    rows = family_rows(prof, artifact, families)
    run = load_run_state(from_run) if from_run else None
    out: dict = {"artifact": artifact, "rows": rows, "prompts_per_call": prompts, "group": group, "arms": {},
                 "families": {}, "complete": False,
                 "from_run": {"checkpoint": run["path"], "step": run["step"], "draft_family": run["draft_family"]}
                 if run else None}
    data: dict[str, dict] = {}
    for arm, row in rows.items():
        cfg = run_config_from_profile(prof, artifact, row, out=str(workdir / arm), seed=0, warm_start=warm_start)
        if cfg.workload.name != "math":
            raise ValueError(f"{artifact}'s workload is {cfg.workload.name!r}; this check samples the math workload")
        tr = CoTrainer(cfg, tokenizer_for_run(cfg, out=workdir / "tok", seed=0, warm_start=warm_start))
        draft_from_run = _load_state(tr, run) if run else False
        g = cfg.grpo
        out.update(temperature=g.temperature, max_new_tokens=g.max_new_tokens)
        n = calls if arm == "none" else data["none"]["calls"]
        d = data[arm] = _sample_arm(tr, prompts=prompts, group=group, calls=n, seed=seed,
                                    budget_s=budget_s / len(rows) if arm == "none" else math.inf)
        del tr
        _release_device_memory()
        out["arms"][arm] = {**{s: float(d[s].mean()) for s in STATISTICS}, "calls": d["calls"],
                            "completions": len(d["reward"]), "seconds": d["seconds"],
                            "hit_max_new_tokens": float((d["length"] >= g.max_new_tokens).double().mean()),
                            "acceptance_length": d["acceptance_length"], "draft_from_run": draft_from_run}
        print(f"[workload_law] {arm}: {out['arms'][arm]}", flush=True)
        if arm != "none":
            res = out["families"][arm] = compare(d, data["none"], max_new_tokens=g.max_new_tokens, alpha=alpha)
            print(f"[workload_law] {arm} vs none: " + ", ".join(
                f"{s} {res[s]['difference']:+.4g} (p {res[s]['p']:.3g})" for s in STATISTICS)
                + f", length law p {res['length_law_p']:.3g}", flush=True)
        if progress is not None:
            progress(out)
    out["complete"] = True
    out["passed"] = all(f["passed"] for f in out["families"].values())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", required=True, type=Path, help="folder for workload_law.json")
    ap.add_argument("--profile", default="h200", help="profile name or .yaml file (default h200)")
    ap.add_argument("--artifact", default="fig3", help="the artifact whose rows (policy, drafts, sampling) are used")
    ap.add_argument("--warm-start", required=True, help="SFT warm-start folder (policy.pt and the drafts' weights)")
    ap.add_argument("--from-run", default="",
                    help="a run folder of the artifact: every arm starts from its last checkpoint's policy (and, for "
                         "its family, draft), e.g. a co-trained run at the steps where its reward fell behind")
    ap.add_argument("--families", default=",".join(FAMILIES), help="keys of the profile's rl.drafts")
    ap.add_argument("--prompts", type=int, default=16, help="training problems per call")
    ap.add_argument("--group", type=int, default=64, help="completions per problem per call")
    ap.add_argument("--calls", type=int, default=1000, help="at most this many calls per arm (the none arm's count is every arm's)")
    ap.add_argument("--budget-s", type=float, default=120.0, help="sampling time of all arms together: the none arm stops making calls after its share")
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
    if args.from_run and not (Path(args.from_run) / CKPT).is_file():
        ap.error(f"--from-run {args.from_run!r}: no checkpoint {CKPT} there; expected a run folder of repro.rl.run")
    prof = checked_profile(ap, args, families)
    if not families:
        ap.error(f"--families {args.families!r}: expected some of {sorted(prof['rl']['drafts'])}")
    prov = provenance({k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()})

    def write(report: dict) -> Path:        # after every arm, so a killed run still leaves its finished arms
        return write_json_atomic(args.out / "workload_law.json", {**report, "provenance": prov})

    with tempfile.TemporaryDirectory(prefix="workload_law_") as tmp:
        report = workload_law(prof, args.artifact, families, warm_start=args.warm_start, prompts=args.prompts,
                              group=args.group, calls=args.calls, budget_s=args.budget_s, alpha=args.alpha,
                              seed=args.seed, workdir=Path(tmp), from_run=args.from_run, progress=write)
    path = write(report)
    print(f"workload_law: passed={report['passed']} -> {path}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
