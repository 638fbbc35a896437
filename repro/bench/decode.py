"""Decode benchmark: throughput of our rollout engine with and without each draft family, batch 1..64.

Builds the profile's policy (``cpu-tiny``: the tiny Qwen3; ``h200``: a ~0.4B Qwen3 in bf16), pre-trains
it briefly on a synthetic Markov language (``repro.models.synthetic``: no checkpoint is available, and
a random-init policy's near-uniform distribution gives drafts nothing to learn), samples rollouts
from it at the benchmark temperature, briefly trains an EAGLE-3, a DFlash and a DSpark draft on those
samples (``repro.models.train_draft``), then times decoding of fresh prompts (temperature 1, exact
rejection sampling) with the plain engine and with each draft at every batch size. Per (family, batch) it records the raw time
samples, tokens/s, acceptance length (accepted + 1 per verify step), the speedup over plain decoding
measured in the same run, and speedup / acceptance length (the engine-overhead figure of merit).
It also checks that greedy speculative output is token-identical to plain greedy output (fp32) and
records the fraction of identical rows. Writes ``bench.json``, ``metrics.jsonl``, ``env.json`` (and
W&B offline logs where wandb is installed) through ``repro.core.timing.BenchRun``.

    python -m repro.bench.decode --profile cpu-tiny                    # ~5 min on 2 CPU cores
    python -m repro.bench.decode --profile cpu-tiny --batch-sizes 1,4 --train-steps 20   # quick look
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

from repro.core.profile import load_profile
from repro.core.provenance import hardware
from repro.core.timing import BenchRun, summarize, time_samples
from repro.models.block_draft import BlockDraftConfig, BlockProposer
from repro.models.dflash import DFlashDraft
from repro.models.dspark import DSparkDraft
from repro.models.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Proposer
from repro.models.policy import build_policy
from repro.models.synthetic import MarkovLanguage, pretrain_policy
from repro.models.train_draft import train_draft
from repro.rollout.engine import RolloutEngine
from repro.rollout.samples import sample_sequences

FAMILIES = ("eagle3", "dflash", "dspark")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# Workload per profile: what the decode benchmark runs at each scale (the profile gives device/dtype).
# The policy is first pre-trained on a synthetic Markov language (repro.models.synthetic) so its
# distribution is peaked and learnable; prompts come from that language.
PRESETS = {
    "cpu-tiny": dict(scale="tiny", vocab_size=128, lang_tokens=120, pretrain_steps=200, pretrain_batch=16,
                     pretrain_len=64, pretrain_lr=3e-3, train_prompts=64, prompt_len=8, sample_tokens=32,
                     train_steps=80, train_batch=16, lr=3e-3, new_tokens=32, temperature=1.0,
                     batch_sizes=(1, 4, 16, 64), repeats=3, eagle_k=3, block_size=4, block_layers=2),
    "h200": dict(scale="gpu", vocab_size=32000, lang_tokens=2048, pretrain_steps=300, pretrain_batch=32,
                 pretrain_len=128, pretrain_lr=1e-3, train_prompts=256, prompt_len=16, sample_tokens=128,
                 train_steps=300, train_batch=32, lr=1e-3, new_tokens=128, temperature=1.0,
                 batch_sizes=(1, 4, 16, 64), repeats=3, eagle_k=4, block_size=8, block_layers=2),
}


def make_draft(family: str, policy, preset: dict):
    """A fresh draft of ``family`` sized from the policy, and a factory of its proposer.

    The draft's parameters are ``preset["draft_dtype"]`` (fp32 master weights by default: AdamW on
    bf16 parameters loses small updates); it reads bf16 taps and rides the bf16 policy's head.
    """
    torch.manual_seed(0)
    ddtype = DTYPES[preset.get("draft_dtype", "float32")]
    if family == "eagle3":
        d = Eagle3Draft(Eagle3Config.from_policy(policy, ttt_steps=preset["eagle_k"]))
        d = d.to(device=policy.device, dtype=ddtype)
        d.init_from_policy(policy)
        return d, (lambda dd=d: Eagle3Proposer(dd, preset["eagle_k"]))
    cfg = BlockDraftConfig.from_policy(policy, num_layers=preset["block_layers"], block_size=preset["block_size"])
    cls = DFlashDraft if family == "dflash" else DSparkDraft
    d = cls(cfg, policy).to(device=policy.device, dtype=ddtype)
    return d, (lambda dd=d: BlockProposer(dd))


def loss_ends(losses: list[float]) -> dict[str, float]:
    """Mean of the first and of the last tenth of a loss curve."""
    k = max(1, len(losses) // 10)
    return {"loss_first": sum(losses[:k]) / k, "loss_last": sum(losses[-k:]) / k}


def pretrain_recorded(bench: BenchRun, policy, lang: MarkovLanguage, preset: dict) -> None:
    """Pre-train ``policy`` on ``lang`` with the preset's settings and record it as the ``pretrain`` row."""
    t0 = time.perf_counter()
    losses = pretrain_policy(policy, lang, steps=preset["pretrain_steps"], batch_size=preset["pretrain_batch"],
                             seq_len=preset["pretrain_len"], lr=preset["pretrain_lr"])
    bench.record("pretrain", {"steps": len(losses)},
                 extra={"pretrain_time_s": time.perf_counter() - t0, **loss_ends(losses),
                        "language_entropy": lang.entropy()})


def proposer_for(family: str, draft, preset: dict):
    return Eagle3Proposer(draft, preset["eagle_k"]) if family == "eagle3" else BlockProposer(draft)



def identity_check(policy, drafts: dict, preset: dict, prompts) -> dict[str, float]:
    """Fraction of rows whose greedy speculative output equals plain greedy output, in fp32."""
    pol32 = policy.copy_as(torch.float32) if policy.dtype != torch.float32 else policy
    plain = RolloutEngine(pol32).generate(prompts, max_new_tokens=preset["new_tokens"] // 2, greedy=True)
    out = {}
    for fam, d in drafts.items():
        d32 = copy.deepcopy(d).float() if policy.dtype != torch.float32 else d
        if hasattr(d32, "attach"):
            d32.attach(pol32)
        pol32.set_taps(d32.tap_spec)
        spec = RolloutEngine(pol32, proposer_for(fam, d32, preset)).generate(
            prompts, max_new_tokens=preset["new_tokens"] // 2, greedy=True)
        out[fam] = sum(a == b for a, b in zip(spec.tokens, plain.tokens)) / len(prompts)
    return out


def run(profile_name: str, out: Path, overrides: dict, deadline_s: float | None = None) -> list[dict]:
    """Run the benchmark into ``out``. With ``deadline_s`` (seconds from now), points not yet started when
    it passes are skipped (listed in the run's config) so the run still ends cleanly with its bench.json."""
    t_start = time.monotonic()
    late = lambda: deadline_s is not None and time.monotonic() - t_start > deadline_s
    profile = load_profile(profile_name)
    if profile_name not in PRESETS:
        raise SystemExit(f"decode has no workload for profile {profile_name!r}; expected one of {sorted(PRESETS)}")
    preset = {**PRESETS[profile_name], **{k: v for k, v in overrides.items() if v is not None}}
    want_cuda = profile["hardware"]["device"] == "cuda"
    if want_cuda and not torch.cuda.is_available():
        raise SystemExit(f"profile {profile_name!r} needs a CUDA GPU and this machine has none")
    device = torch.device("cuda" if want_cuda else "cpu")
    dtype = DTYPES[profile["dtype"]] if want_cuda else torch.float32
    families = preset.get("families") or FAMILIES
    config = {"profile": profile_name, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
              "families": list(families), **{k: (list(v) if isinstance(v, tuple) else v) for k, v in preset.items()
                                           if k != "families"}}
    policy = build_policy("qwen3", preset["scale"], seed=0, dtype=dtype, device=device,
                          vocab_size=preset["vocab_size"])
    config["policy_parameters"] = policy.num_parameters()
    # the MASK id of the block drafts (last vocabulary id) must stay out of the language
    lang = MarkovLanguage(policy.vocab_size - 1, preset["lang_tokens"], seed=0)
    train_prompts = lang.sample(preset["train_prompts"], preset["prompt_len"], seed=1).tolist()
    eval_prompts = lang.sample(max(preset["batch_sizes"]), preset["prompt_len"], seed=2).tolist()
    temp = preset["temperature"]
    skipped: list[str] = []
    config["skipped_for_deadline"] = skipped      # shared with BenchRun's (shallow) copy of the config
    with BenchRun(out, artifact="decode", profile=profile_name, config=config) as bench:
        pretrain_recorded(bench, policy, lang, preset)
        t0 = time.perf_counter()
        seqs, plens = sample_sequences(policy, train_prompts, max_new_tokens=preset["sample_tokens"],
                                       temperature=temp)
        bench.record("sample", {"prompts": len(seqs)}, extra={"sample_time_s": time.perf_counter() - t0})
        drafts = {}
        for fam in families:
            d, _ = make_draft(fam, policy, preset)
            t0 = time.perf_counter()
            losses = train_draft(d, policy, seqs, plens, steps=preset["train_steps"], lr=preset["lr"],
                                 batch_size=preset["train_batch"],
                                 fallback_backend="torch")
            bench.record(f"train/{fam}", {"family": fam, "steps": len(losses), "attn_backend": d.attn_backend},
                         extra={"train_time_s": time.perf_counter() - t0, **loss_ends(losses)})
            drafts[fam] = d.eval()
        ident = identity_check(policy, drafts, preset, eval_prompts[:4])
        for fam, frac in ident.items():
            bench.record(f"identity/{fam}", {"family": fam, "rows": 4}, extra={"greedy_identical_frac": frac})
        for B in preset["batch_sizes"]:
            if late():
                skipped.append(f"b{B}")
                continue
            prompts = eval_prompts[:B]
            base = None
            for fam in ("plain", *families):
                if fam != "plain":
                    policy.set_taps(drafts[fam].tap_spec)
                eng = RolloutEngine(policy, None if fam == "plain" else proposer_for(fam, drafts[fam], preset))
                result = {}

                def go(eng=eng, prompts=prompts, result=result):
                    result["r"] = eng.generate(prompts, max_new_tokens=preset["new_tokens"], temperature=temp)

                samples = time_samples(go, warmup=1, repeats=preset["repeats"], device=device)
                r = result["r"]
                ntok = sum(len(t) for t in r.tokens)
                med = summarize(samples)["median"]
                extra = {"tokens_per_s": ntok / med, "acceptance_length": r.counters.acceptance_length,
                         "policy_forwards": r.policy_forwards, "new_tokens": ntok}
                if fam == "plain":
                    base = med
                else:
                    extra["speedup"] = base / med
                    extra["speedup_over_al"] = extra["speedup"] / r.counters.acceptance_length
                    for i, a in enumerate(r.counters.accepted_per_pos):
                        extra[f"accept_rate_pos{i}"] = a / max(1, r.counters.verify_steps)
                bench.record(f"{fam}/b{B}", {"family": fam, "batch": B, "new_tokens": preset["new_tokens"]},
                             samples, extra=extra)
        # acceptance under greedy decoding, batch 8: acceptance only, one run each
        for fam in families:
            if late():
                skipped.append(f"{fam}/greedy")
                continue
            policy.set_taps(drafts[fam].tap_spec)
            r = RolloutEngine(policy, proposer_for(fam, drafts[fam], preset)).generate(
                eval_prompts[:8], max_new_tokens=preset["new_tokens"], greedy=True)
            bench.record(f"{fam}/greedy", {"family": fam, "batch": 8, "greedy": True},
                         extra={"acceptance_length": r.counters.acceptance_length})
        return bench.records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Decode throughput with and without each draft family.")
    ap.add_argument("--profile", default="cpu-tiny", help="hardware profile: cpu-tiny or h200 (default cpu-tiny)")
    ap.add_argument("--out", type=Path, default=None, help="run folder (default results/<hw>/<profile>/decode)")
    ap.add_argument("--batch-sizes", default=None, help="comma-separated batch sizes (default: the profile's)")
    ap.add_argument("--train-steps", type=int, default=None, help="draft training steps per family")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens generated per row")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per point")
    ap.add_argument("--families", default=None, help="comma-separated subset of eagle3,dflash,dspark")
    args = ap.parse_args(argv)
    over = {"train_steps": args.train_steps, "new_tokens": args.new_tokens, "repeats": args.repeats,
            "batch_sizes": tuple(int(b) for b in args.batch_sizes.split(",")) if args.batch_sizes else None,
            "families": tuple(args.families.split(",")) if args.families else None}
    if over["families"]:
        bad = [f for f in over["families"] if f not in FAMILIES]
        if bad:
            raise SystemExit(f"--families {bad} not in {FAMILIES}")
    out = args.out or Path("results") / hardware()["tag"] / args.profile / "decode"
    run(args.profile, out, over)
    print(f"wrote {out}/bench.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
