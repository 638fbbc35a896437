"""Does co-training leave the policy's learning alone *on this device*? Two checks in the profile's dtype and rollout
mode (on a GPU: bf16 rollout, the draft's CUDA graphs, bf16 autocast over fp32 master weights).

The CPU tests prove both claims in fp32 (tests/rollout/test_sampling.py, tests/rl/test_joint.py); this runs them
where the RL figures are measured.

1. **law**: speculative sampling draws the policy's law. A policy of the profile's dense shape with a 12-token
   vocabulary (so the law of a three-token completion can be enumerated; ``--init-std`` makes it peaked, so the
   drafts' proposals are often rejected, but not so peaked that the chi-square has few cells) completes one prompt
   ``--samples`` times with each draft family (random init) on the profile's rollout engine, and once with no
   draft: the control, the same statistic without speculation. Pearson's chi-square compares the counts of (y1, y2) and of (y2, y3) with the exact laws of that
   same policy (``repro.rollout.law``). A family passes when both p-values exceed ``--alpha``.
2. **update**: the joint update (the row's draft, loss weight, draft microbatch and graphed draft step) leaves the
   policy bit-identical to the no-draft update on the same rollout batches. All trainers start from one random
   policy; the batches are the no-draft trainer's rollouts with fixed alternating rewards (nonzero advantages). A
   second no-draft trainer measures the device's own run-to-run difference: if even two no-draft updates differ
   (non-deterministic kernels), a drafted one is judged against that spread, not against bit-identity.

Writes ``OUT/cotrain_checks.json`` (provenance, config, per check and family: p-values, acceptance length,
differing tensors and the largest difference, ``passed``) atomically.

    python -m repro.bench.cotrain_checks --out $OUT/cotrain --profile h200                 # one H200, ~2 min
    python -m repro.bench.cotrain_checks --out /tmp/cc --profile cpu-tiny --samples 3000   # CPU dry run
    python -m repro.bench.cotrain_checks --out /tmp/cc --profile cpu-tiny --law-dtype bfloat16   # bf16 on a CPU
"""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from repro.models.policy import build_policy
from repro.report.provenance import provenance, write_json_atomic
from repro.rl.config import DraftSpec, load_run_profile, run_config_from_profile
from repro.rl.drafts import build_draft, make_proposer
from repro.rl.grpo import group_advantages
from repro.rl.hf_tokenizer import tokenizer_for_run
from repro.rl.trainer import CoTrainer
from repro.rl.warmstart import DTYPES
from repro.rollout.engine import RolloutEngine
from repro.rollout.law import chi2_pvalue, exact_pair_laws

FAMILIES = ("eagle3", "dflash", "dspark")
LAW_VOCAB, LAW_PROMPT = 12, (3, 1, 4)
INIT_STDS, MIN_ENTROPY = (0.2, 0.1, 0.05, 0.02), 1.2        # --init-std auto (law_check)


def law_check(prof: dict, families: list[str], *, samples: int, chunk: int, alpha: float, init_std: float | None,
              seed: int) -> dict:
    """Chi-square of the three-token completions' pair laws, per family and for plain sampling (``"none"``)."""
    rl, dev, dtype = prof["rl"], _device(prof), DTYPES[prof.get("dtype", "float32")]
    spec = rl["policies"]["dense"]
    temperature = float(rl["grpo"].get("temperature", 1.0))
    # how peaked a random policy's law is depends on its depth and width: "auto" takes the largest init std whose
    # first token still has MIN_ENTROPY nats (peaked, so proposals are often rejected; spread, so the chi-square has
    # many cells)
    for std in (INIT_STDS if init_std is None else (init_std,)):
        policy = build_policy(spec["family"], spec.get("scale", "tiny"), seed=seed, dtype=dtype, device=dev,
                              init_std=std, **{**spec.get("overrides", {}), "vocab_size": LAW_VOCAB})
        joint12, joint23 = exact_pair_laws(policy, LAW_PROMPT, temperature=temperature)
        p1 = joint12.sum(1)
        entropy = float(-(p1 * p1.clamp_min(1e-300).log()).sum())
        if entropy >= MIN_ENTROPY:
            break
    mode = "draft" if dev.startswith("cuda") and (rl.get("rollout") or {}).get("cuda_graphs") == "draft" else "off"
    out: dict = {"vocab": LAW_VOCAB, "prompt": list(LAW_PROMPT), "temperature": temperature, "cuda_graphs": mode,
                 "dtype": str(dtype), "init_std": std, "first_token_entropy": entropy, "samples": samples,
                 "families": {}}
    for fam in ["none", *families]:
        try:
            out["families"][fam] = _law_family(policy, rl, fam, mode, dtype, joint12, joint23, samples=samples,
                                               chunk=chunk, alpha=alpha, temperature=temperature, seed=seed)
        except Exception as exc:  # noqa: BLE001 -- one family's failure is recorded, the next runs
            traceback.print_exc()
            out["families"][fam] = {"error": f"{type(exc).__name__}: {exc}", "passed": False}
        _release_device_memory()
        print(f"[law] {fam}: {out['families'][fam]}", flush=True)
    out["passed"] = all(f["passed"] for f in out["families"].values())
    return out


def _law_family(policy, rl: dict, fam: str, mode: str, dtype: torch.dtype, joint12: torch.Tensor,
                joint23: torch.Tensor, *, samples: int, chunk: int, alpha: float, temperature: float,
                seed: int) -> dict:
    """One family's (or ``"none"``'s) completions and p-values. Its own function so that the draft, the engine and
    the engine's CUDA graphs (tens of GB at a 4000-row chunk) are unreferenced once it returns: the next family's
    graphs are captured only after ``_release_device_memory``."""
    t0 = time.perf_counter()
    torch.manual_seed(seed + 1)
    proposer = None
    if fam != "none":
        d = rl["drafts"][fam]
        dspec = DraftSpec(d["family"], num_proposals=d["num_proposals"], options=d.get("options") or {})
        draft = build_draft(dspec, policy, mask_token_id=LAW_VOCAB - 1).to(dtype=dtype)
        proposer = make_proposer(draft, dspec.num_proposals)
    engine = RolloutEngine(policy, proposer, cuda_graphs=mode if proposer is not None else "off")
    toks, accepted, verify_steps = [], 0, 0
    for i in range(0, samples, chunk):
        n = min(chunk, samples - i)
        res = engine.generate([list(LAW_PROMPT)] * n, max_new_tokens=3, temperature=temperature,
                              seed=seed * 1000 + i)
        toks.append(torch.tensor(res.tokens))
        if res.counters is not None:
            accepted += res.counters.accepted
            verify_steps += res.counters.verify_steps
    t = torch.cat(toks)
    if t.shape[1] != 3:
        raise RuntimeError(f"expected 3-token completions, got {t.shape[1]}")
    p12 = chi2_pvalue(torch.bincount(t[:, 0] * LAW_VOCAB + t[:, 1], minlength=LAW_VOCAB ** 2), joint12)
    p23 = chi2_pvalue(torch.bincount(t[:, 1] * LAW_VOCAB + t[:, 2], minlength=LAW_VOCAB ** 2), joint23)
    result = {"p_y1y2": p12, "p_y2y3": p23, "passed": min(p12, p23) > alpha,
              "acceptance_length": 1 + accepted / verify_steps if verify_steps else None,
              "seconds": time.perf_counter() - t0}
    if proposer is not None:
        result["graph_fallbacks"] = {k: v["fallback_reason"] for k, v in engine.graph_status().items()
                                     if v["fallback_reason"]}
    return result


def _release_device_memory() -> None:
    """Frees what the last family left (its graphs' private pools once their graphs are collected)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _state(trainer: CoTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.policy.model.state_dict().items()}


def _difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict:
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    largest = max(((a[k].double() - b[k].double()).abs().max().item() for k in differ), default=0.0)
    return {"tensors_differing": len(differ), "tensors": len(a), "max_abs_diff": largest, "first": differ[:5]}


def family_rows(prof: dict, artifact: str, families: list[str]) -> dict[str, str]:
    """The artifact's row per arm: ``"none"`` (its no-draft row), then each family's row."""
    rows = prof[artifact]["rows"]
    by_family = {(s or {}).get("draft"): r for r, s in rows.items() if (s or {}).get("draft")}
    missing = [f for f in families if f not in by_family]
    if missing:
        raise ValueError(f"{artifact} has no row with draft(s) {missing}; its drafted rows: {sorted(by_family)}")
    base = next(r for r, s in rows.items() if not (s or {}).get("draft"))
    return {"none": base, **{f: by_family[f] for f in families}}


def update_check(prof: dict, artifact: str, families: list[str], *, steps: int, workdir: Path) -> dict:
    """Policy parameters after ``steps`` joint updates vs no-draft updates on the same batches, per family."""
    by_family = family_rows(prof, artifact, families)
    base_row = by_family.pop("none")

    def trainer(row: str, name: str) -> CoTrainer:
        cfg = run_config_from_profile(prof, artifact, row, out=str(workdir / name), seed=0)
        return CoTrainer(cfg, tokenizer_for_run(cfg, out=workdir / "tok", seed=0))

    plain, control = trainer(base_row, "plain"), trainer(base_row, "control")
    init = _state(plain)
    g = plain.cfg.grpo
    batches = []
    for step in range(steps):
        batch = plain.rollout(step)
        # fixed alternating rewards: every group has nonzero advantages whatever the random policy earned
        batch.rewards = (torch.arange(batch.size) % 2).to(batch.rewards)
        batches.append((batch, group_advantages(batch.rewards, g.generations_per_prompt, g.normalize_std)))

    def train(tr: CoTrainer) -> dict[str, torch.Tensor]:
        for step, (batch, adv) in enumerate(batches):
            tr.update.step(batch, adv, anchor_seed=step, temperature=g.temperature)
        return _state(tr)

    ref = train(plain)
    out: dict = {"artifact": artifact, "steps": steps, "batch_rows": batches[0][0].size,
                 "autocast": str(plain.update.autocast_dtype), "families": {}}
    out["updated"] = _difference(init, ref)["tensors_differing"] > 0
    out["control_no_draft"] = _difference(ref, train(control))
    del control
    for fam in families:
        try:
            co = trainer(by_family[fam], fam)
            start = _difference(init, _state(co))
            diff = _difference(ref, train(co))
            ds = co.cfg.draft
            out["families"][fam] = {"row": by_family[fam], "same_start": start["tensors_differing"] == 0,
                                    "loss_weight": ds.loss_weight, "draft_microbatch": ds.microbatch,
                                    "draft_cuda_graph": bool(ds.cuda_graph), **diff}
            del co
        except Exception as exc:  # noqa: BLE001 -- recorded; the next family runs
            traceback.print_exc()
            out["families"][fam] = {"error": f"{type(exc).__name__}: {exc}"}
        _release_device_memory()
        print(f"[update] {fam}: {out['families'][fam]}", flush=True)
    spread = out["control_no_draft"]["max_abs_diff"]
    for f in out["families"].values():
        if "error" in f:
            f["passed"] = False
        else:       # bit-identical, or (non-deterministic device) no further from the baseline than its own repeat
            f["passed"] = f["same_start"] and (f["tensors_differing"] == 0 or f["max_abs_diff"] <= spread)
    out["passed"] = out["updated"] and all(f["passed"] for f in out["families"].values())
    return out


def _in_tempdir(fn):
    with tempfile.TemporaryDirectory(prefix="cotrain_checks_") as tmp:
        return fn(Path(tmp))


def _device(prof: dict) -> str:
    want = (prof.get("hardware") or {}).get("device", "cpu")
    if want.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"profile {prof.get('name')!r} needs a GPU (hardware.device={want!r}); none is visible. "
                         "Use --profile cpu-tiny for a CPU dry run.")
    return want


def checked_profile(ap: argparse.ArgumentParser, args: argparse.Namespace, families: list[str]) -> dict:
    """The profile of ``--profile``, with ``families`` and ``--artifact`` checked against it (``ap.error`` names a
    bad value) and its device present: the command lines of this module and ``repro.bench.workload_law``."""
    prof = load_run_profile(args.profile)
    bad = [f for f in families if f not in prof["rl"]["drafts"]]
    if bad:
        ap.error(f"--families {bad}: not drafts of profile {args.profile!r}; expected some of "
                 f"{sorted(prof['rl']['drafts'])}")
    if args.artifact not in prof:
        ap.error(f"--artifact {args.artifact!r}: profile {args.profile!r} has no such section")
    _device(prof)
    return prof


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", required=True, type=Path, help="folder for cotrain_checks.json")
    ap.add_argument("--profile", default="h200", help="profile name or .yaml file (default h200)")
    ap.add_argument("--artifact", default="fig3", help="the artifact whose rows the update check builds")
    ap.add_argument("--families", default=",".join(FAMILIES), help="keys of the profile's rl.drafts")
    ap.add_argument("--checks", default="law,update", help="which checks: law, update or both")
    ap.add_argument("--samples", type=int, default=40000, help="three-token completions per family (law check)")
    ap.add_argument("--chunk", type=int, default=2000,
                    help="completions per generate call (on the H200, 4000 left the graphs short of memory)")
    ap.add_argument("--alpha", type=float, default=1e-3, help="a law check fails below this p-value")
    ap.add_argument("--init-std", default="auto",
                    help="the law policy's init std; auto: the largest of 0.2, 0.1, 0.05, 0.02 leaving the first "
                         f"token {MIN_ENTROPY} nats of entropy (a peaked law, so proposals are often rejected)")
    ap.add_argument("--update-steps", type=int, default=2, help="updates per trainer (update check)")
    ap.add_argument("--law-dtype", default="", choices=["", *DTYPES],
                    help="the law check's dtype instead of the profile's (e.g. bfloat16 on a CPU, to see bf16 "
                         "rounding without a GPU; the update check builds the profile's runs, which stay fp32 on CPU)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    if not checks or any(c not in ("law", "update") for c in checks):
        ap.error(f"--checks {args.checks!r}: expected law, update or law,update")
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    for name in ("samples", "chunk", "update_steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected a positive integer")
    if not 0 < args.alpha < 1:
        ap.error(f"--alpha {args.alpha}: expected a level between 0 and 1")
    try:
        init_std = None if args.init_std == "auto" else float(args.init_std)
    except ValueError:
        ap.error(f"--init-std {args.init_std!r}: expected auto or a positive number")
    if init_std is not None and init_std <= 0:
        ap.error(f"--init-std {args.init_std!r}: expected auto or a positive number")
    prof = checked_profile(ap, args, families)
    report: dict = {"profile": args.profile, "checks": {}}
    t0 = time.perf_counter()
    runs = {"law": lambda: law_check({**prof, "dtype": args.law_dtype or prof.get("dtype", "float32")}, families,
                                     samples=args.samples, chunk=args.chunk, alpha=args.alpha, init_std=init_std,
                                     seed=args.seed),
            "update": lambda: _in_tempdir(lambda tmp: update_check(prof, args.artifact, families,
                                                                   steps=args.update_steps, workdir=tmp))}
    for name in checks:
        try:
            report["checks"][name] = runs[name]()
        except Exception as exc:  # noqa: BLE001 -- recorded as a failed check; the other check still runs
            traceback.print_exc()
            report["checks"][name] = {"error": f"{type(exc).__name__}: {exc}", "passed": False}
    report["passed"] = all(c["passed"] for c in report["checks"].values())
    report["wall_s"] = time.perf_counter() - t0
    report["provenance"] = provenance({k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()})
    path = write_json_atomic(args.out / "cotrain_checks.json", report)
    print(f"cotrain_checks: passed={report['passed']} -> {path}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
