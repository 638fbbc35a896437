"""Where a decode step's time goes on one GPU: our engine's plain and speculative steps, per engine mode and batch,
with the decode benchmark's policy (a profile's ``decode:`` section) and fresh drafts of each family (untrained:
acceptance differs from the benchmark's, the step's work does not). Prints, per case, the wall time per policy
forward (CUDA-synchronised, medians of 3 requests), the kernel time and kernel count per forward from
torch.profiler, the kernels that take most of it, the host's costliest calls (graph launches, waits), and each
captured graph alone (``--graphs``: its replay's device time per shape and its replays in one request; what the
request's time leaves beyond them is eager work and launch gaps). Writes nothing; the decode benchmark
(``snakemake decode``) is where results come from.

    PYTHONPATH=. python studies/decode_profile/step_kernels.py --profile h200 --modes compiled --batches 1,64 \
        --families plain,eagle3,dspark
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from repro.bench.decode import decode_settings, make_draft, proposer_for
from repro.core.profile import load_profile
from repro.decoding.cuda_graph import GraphedCallable
from repro.models.policy import build_policy
from repro.rollout.engine import RolloutEngine


def timed_forwards(eng, prompts, new_tokens):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = eng.generate(prompts, max_new_tokens=new_tokens, temperature=1.0)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / res.policy_forwards, res


def report(eng, prompts, new_tokens, top: int):
    for _ in range(2):                                     # captures and compiles
        eng.generate(prompts, max_new_tokens=new_tokens, temperature=1.0)
    runs = [timed_forwards(eng, prompts, new_tokens) for _ in range(3)]
    wall = statistics.median(t for t, _ in runs)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _, res = timed_forwards(eng, prompts, new_tokens)
    n = res.policy_forwards
    kernels = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name][0] += 1
            kernels[e.name][1] += e.device_time_total
    gpu_us = sum(t for _, t in kernels.values()) / n
    count = sum(c for c, _ in kernels.values()) / n
    print(f"  wall {wall * 1e3:.3f} ms / forward, kernels {gpu_us:.0f} us in {count:.0f} launches / forward, "
          f"AL {res.counters.acceptance_length:.2f}")
    for name, (c, t) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"    {t / n:8.1f} us {c / n:6.1f}x  {name[:100]}")
    host = sorted(prof.key_averages(), key=lambda a: -a.self_cpu_time_total)[:6]
    print("  host: " + ", ".join(f"{a.key} {a.self_cpu_time_total / n:.0f} us ({a.count / n:.1f}x)" for a in host))


def graph_callables(eng):
    """(name, GraphedCallable) of an engine's static decoder and proposer, every state kept."""
    states = list(eng.static_decoder.states._states.values()) if eng.static_decoder is not None else []
    if hasattr(eng.proposer, "_states"):
        states += [st["_graphs"] for st in eng.proposer._states._states.values()]
    return [(v.name, v) for st in states for v in st.values() if isinstance(v, GraphedCallable)]


def graph_breakdown(eng, prompts, new_tokens, replays: int = 20):
    """Each captured graph replayed alone (device ms per replay, per shape), and its replays in one request."""
    for _, g in graph_callables(eng):
        g.replays = 0
    wall, res = timed_forwards(eng, prompts, new_tokens)
    request_ms = wall * res.policy_forwards * 1e3
    for name, g in graph_callables(eng):
        per_request = g.replays
        for key, (graph, _, _) in g._graphs.items():
            if graph is None:
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end) / replays
            shape = "x".join(str(d) for d in key[0][0][0]) if key[0] else "-"
            print(f"    graph {name:18s} [{shape:>8s}] {ms:7.3f} ms / replay", flush=True)
        if per_request:
            print(f"    graph {name:18s} {per_request} replays this request", flush=True)
    print(f"  request {request_ms:.2f} ms over {res.policy_forwards} forwards", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="h200", help="profile whose decode: section sizes the policy")
    ap.add_argument("--modes", default="compiled", help="engine modes, comma-separated (all, compiled, fused, ...)")
    ap.add_argument("--batches", default="1,64", help="batch sizes, comma-separated")
    ap.add_argument("--families", default="plain,eagle3,dflash,dspark", help="plain and/or draft families")
    ap.add_argument("--top", type=int, default=12, help="kernels listed per case")
    ap.add_argument("--graphs", action="store_true", help="also time each captured graph alone")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("step_kernels needs a CUDA device (it profiles GPU kernels)")
    s = decode_settings(load_profile(a.profile).get("decode"), a.profile)
    pol = build_policy("qwen3", s.scale, dtype=torch.bfloat16, device="cuda", vocab_size=s.vocab_size,
                       **s.policy_overrides)
    g = torch.Generator().manual_seed(0)
    for fam in a.families.split(","):
        prop_for = None
        if fam != "plain":
            draft = make_draft(fam, pol, s).eval().to(torch.bfloat16)
            pol.set_taps(draft.tap_spec)
            prop_for = lambda: proposer_for(fam, draft, s)
        for mode in a.modes.split(","):
            eng = RolloutEngine(pol, prop_for() if prop_for else None, cuda_graphs=mode,
                                max_model_len=s.prompt_len + s.new_tokens + 16)
            for B in (int(b) for b in a.batches.split(",")):
                prompts = [torch.randint(1, s.lang_tokens, (s.prompt_len,), generator=g).tolist() for _ in range(B)]
                print(f"{fam} / {mode} / b{B}:", flush=True)
                report(eng, prompts, s.new_tokens, a.top)
                if a.graphs:
                    graph_breakdown(eng, prompts, s.new_tokens)


if __name__ == "__main__":
    main()
