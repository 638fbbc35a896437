"""Engine self-check for a GPU run: greedy token identity of every engine mode and family, and per-step times.

``run_self_check(policy, drafts, make_proposer, prompts, new_tokens=..., timing_batches=(1, 64))`` checks,
in fp32 copies of the policy and drafts (so that one-token and (k+1)-token forwards agree on every argmax):

* identity: greedy output of every family (and plain decoding) under every engine mode (``off``: dynamic
  caches; ``draft``: the draft on static caches, graphed on CUDA; ``all``: policy and draft on static caches,
  graphed) equals plain greedy decoding on dynamic caches, token for token, stop reasons included, on
  ragged prompts with a stop token; the static path's acceptance counters equal the dynamic path's;
* smallest cache: each family under the last static mode checked, on the smallest policy cache the request fits
  (``policy_cache_slots``: the prompt, the answer and one verify step; each row writes at its own frontier, so
  a step overwrites the proposals the last one rejected and the last columns are reached): the same identity,
  and the compactions counted (none are needed);
* graphs: on CUDA, under ``draft`` and ``all`` every graphed call captured and none fell back to eager;
* timing (in the policy's own dtype): ms per verify step of plain decoding and of each family, per mode and
  batch size (median of a few calls), so one device call shows where a step's time goes.

It returns a JSON-able report with ``passed`` and ``failures`` (one line per failed check, naming it), and
``verdict_table(report)`` prints the verdict table. The decode benchmark runs it first on CUDA
(``python -m repro.bench.decode --profile h200 --self-check-only --out DIR``) and exits non-zero when it fails.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence

import torch

from repro.rollout.engine import CUDA_GRAPH_MODES, STATIC_MODES, RolloutEngine


def _fp32(policy, drafts):
    if policy.dtype == torch.float32:
        return policy, drafts
    pol32 = policy.copy_as(torch.float32)
    out = {}
    for fam, d in drafts.items():
        d32 = copy.deepcopy(d).float()
        if hasattr(d32, "attach"):
            d32.attach(pol32)
        out[fam] = d32
    return pol32, out


def _engine(policy, drafts, make_proposer, fam: str, mode: str) -> RolloutEngine:
    if fam == "plain":
        return RolloutEngine(policy, None, cuda_graphs=mode if mode in STATIC_MODES else "off")
    policy.set_taps(drafts[fam].tap_spec)
    return RolloutEngine(policy, make_proposer(fam, drafts[fam]), cuda_graphs=mode)


def _smallest_cache_engine(policy, drafts, make_proposer, fam: str, mode: str, prompts, new_tokens: int):
    """``fam``'s engine in ``mode`` on the smallest policy cache the request fits (the engine's ``policy_slots``
    refuses a request that needs more)."""
    eng = _engine(policy, drafts, make_proposer, fam, mode)
    longest = eng.static_decoder.prompt_columns(max(len(p) for p in prompts))
    eng.policy_cache_slots = eng.smallest_policy_cache(longest, new_tokens)
    return eng


def _graph_failures(eng: RolloutEngine, where: str) -> list[str]:
    bad = []
    for call, st in eng.graph_status().items():
        if st.get("fallback_reason"):
            bad.append(f"{where}: graph {call} fell back to eager: {st['fallback_reason']}")
        elif st.get("enabled") and st.get("captures", 0) == 0 and st.get("eager_calls", 0) > 0:
            bad.append(f"{where}: graph {call} was never captured ({st['eager_calls']} eager calls)")
    return bad


def run_self_check(policy, drafts: dict, make_proposer: Callable, prompts: Sequence[Sequence[int]], *,
                   new_tokens: int = 24, stop_token: int | None = None, timing_batches: Sequence[int] = (1, 64),
                   timing_prompts: Sequence[Sequence[int]] | None = None, timing_repeats: int = 3,
                   modes: Sequence[str] = CUDA_GRAPH_MODES, progress: Callable[[str], None] = print) -> dict:
    on_gpu = policy.device.type == "cuda"
    bad = [m for m in modes if m not in CUDA_GRAPH_MODES]
    if bad or "off" not in modes:
        raise ValueError(f"modes={list(modes)} is invalid: expected engine modes from {CUDA_GRAPH_MODES}, "
                         "\"off\" (the reference) among them")
    modes = list(modes)
    report: dict = {"device": str(policy.device), "modes": modes, "families": ["plain", *drafts],
                    "identity": {}, "counters_equal": {}, "compactions": {}, "graphs": {}, "ms_per_step": {},
                    "failures": []}
    smallest_mode = next((m for m in reversed(modes) if m in STATIC_MODES), None)
    fails = report["failures"]
    pol32, d32 = _fp32(policy, drafts)
    stops = () if stop_token is None else (stop_token,)
    ref = RolloutEngine(pol32).generate(prompts, max_new_tokens=new_tokens, greedy=True, stop_tokens=stops)
    for fam in ["plain", *drafts]:
        off_counters = None
        runs = [(m, False) for m in modes] + ([(smallest_mode, True)] if smallest_mode and fam != "plain" else [])
        for mode, smallest in runs:
            if fam == "plain" and mode == "draft":
                continue
            key = f"{fam}/{mode}" + ("+smallest" if smallest else "")
            eng = (_smallest_cache_engine(pol32, d32, make_proposer, fam, mode, prompts, new_tokens) if smallest
                   else _engine(pol32, d32, make_proposer, fam, mode))
            got = eng.generate(prompts, max_new_tokens=new_tokens, greedy=True, stop_tokens=stops)
            if smallest:
                report["compactions"][key] = got.cache_compactions
            same = [a == b for a, b in zip(got.tokens, ref.tokens)]
            frac = sum(same) / len(same)
            report["identity"][key] = frac
            if frac < 1 or got.finish_reason != ref.finish_reason:
                first = same.index(False) if False in same else 0
                fails.append(f"identity {key}: {frac:.2f} of rows equal plain greedy (row {first}: "
                             f"{got.tokens[first][:8]}... vs {ref.tokens[first][:8]}...)")
            counters = got.counters.as_dict()
            if mode == "off":
                off_counters = counters
            elif off_counters is not None and frac == 1:
                equal = counters == off_counters
                report["counters_equal"][key] = equal
                if not equal:
                    fails.append(f"counters {key}: {counters} differ from the dynamic path's {off_counters}")
            if on_gpu and mode != "off":
                report["graphs"][key] = eng.graph_status()
                fails.extend(_graph_failures(eng, key))
            progress(f"self-check identity {key}: {frac:.2f}")
    # per-step times in the policy's own dtype
    tprompts = list(timing_prompts or prompts)
    for B in timing_batches:
        batch = [tprompts[i % len(tprompts)] for i in range(B)]
        for fam in ["plain", *drafts]:
            for mode in modes:
                if fam == "plain" and mode == "draft":
                    continue
                eng = _engine(policy, drafts, make_proposer, fam, mode)
                eng.generate(batch, max_new_tokens=new_tokens, temperature=1.0, seed=0)      # warm-up / capture
                times, fwd = [], 1
                for r in range(timing_repeats):
                    if on_gpu:
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    out = eng.generate(batch, max_new_tokens=new_tokens, temperature=1.0, seed=r + 1)
                    if on_gpu:
                        torch.cuda.synchronize()
                    times.append((time.perf_counter() - t0) / out.policy_forwards)
                    fwd = out.policy_forwards
                ms = sorted(times)[len(times) // 2] * 1e3
                report["ms_per_step"][f"{fam}/{mode}/b{B}"] = {"ms_per_step": ms, "forwards": fwd,
                                                               "acceptance_length": out.counters.acceptance_length}
                progress(f"self-check time {fam}/{mode}/b{B}: {ms:.3f} ms/step, "
                         f"AL {out.counters.acceptance_length:.2f}")
    report["passed"] = not fails
    return report


def verdict_table(report: dict) -> str:
    """The self-check's verdict as a fixed-width table (identity per family x mode, per-step times, failures)."""
    modes = report["modes"]
    lines = ["engine self-check on " + report["device"], "",
             "greedy identity vs plain greedy (fraction of rows; 1.00 = token-identical)",
             f"{'family':8s} " + " ".join(f"{m:>7s}" for m in modes)]
    for fam in report["families"]:
        cells = [report["identity"].get(f"{fam}/{m}") for m in modes]
        lines.append(f"{fam:8s} " + " ".join(f"{'-':>7s}" if c is None else f"{c:7.2f}" for c in cells))
    for key, n in report.get("compactions", {}).items():
        lines.append(f"{key:24s} {report['identity'][key]:7.2f}  (on the smallest policy cache: {n} compactions)")
    if report["ms_per_step"]:
        lines += ["", "ms per step (median; AL = tokens per verify step)"]
        for key, v in report["ms_per_step"].items():
            lines.append(f"  {key:24s} {v['ms_per_step']:8.3f} ms  AL {v['acceptance_length']:.2f}")
    lines += ["", "VERDICT: " + ("PASS" if report["passed"] else f"FAIL ({len(report['failures'])} checks)")]
    lines += [f"  - {f}" for f in report["failures"]]
    return "\n".join(lines)
