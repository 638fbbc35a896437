"""A/B timing of the CPU attention path between two source trees of kernels/ (cpu-emulated).

Times the Figure-5 style EAGLE-3 TTT step on one rank (K passes of ``eagle3_ttt_attention``,
forward + backward, gradients consumed by hooks) with the cpu-tiny shapes (16 query heads, 4 KV
heads, head dim 32, fp32, auto backend = sdpa_cpu) on the fig5 workload's packed lengths. Each
sample runs in a fresh subprocess with one thread, alternating A and B, so both see the same machine
load; the result is the ratio of the medians (B / A: above 1 means B is slower). Intended for "did
this change slow the CPU path": A = a ``git archive`` of the old kernels/, B = the working tree.

    git archive HEAD~3 kernels | tar -x -C /tmp/old
    .venv/bin/python -m repro.bench.attention_cpu_ab --a /tmp/old --b . --rounds 7 --out /tmp/ab.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time, torch
torch.set_num_threads(1)
from kernels.attention import eagle3_ttt_attention
lengths, passes, H, G, D, reps = json.loads(sys.argv[1])
cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
T = int(cu[-1])
g = torch.Generator().manual_seed(0)
def leaf(*s):
    x = torch.randn(*s, generator=g).requires_grad_()
    x.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    return x
qs = [leaf(T, H, D) for _ in range(passes)]
ks = [leaf(T, G, D) for _ in range(passes)]
vs = [leaf(T, G, D) for _ in range(passes)]
dout = torch.randn(T, H, D, generator=g)
def step():
    outs = [eagle3_ttt_attention(qs[p], ks[:p + 1], vs[:p + 1], cu) for p in range(passes)]
    torch.autograd.backward(outs, [dout] * passes)
step()
ts = []
for _ in range(reps):
    t0 = time.perf_counter(); step(); ts.append(time.perf_counter() - t0)
print(json.dumps(min(ts)))
"""


def sample(tree: Path, cfg: list) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], cwd=str(tree.resolve()), env=env,
                         capture_output=True, text=True, timeout=900, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"child in {tree} failed: {out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="source tree A (holds kernels/)")
    ap.add_argument("--b", type=Path, required=True, help="source tree B (holds kernels/)")
    ap.add_argument("--scale", type=int, default=8, help="fig5 workload lengths / scale (cpu-tiny: 8)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="A/B subprocess pairs")
    ap.add_argument("--reps", type=int, default=2, help="timed steps per subprocess (min is kept)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    for t in (args.a, args.b):
        if not (t / "kernels" / "attention").is_dir():
            raise SystemExit(f"--a/--b must be source trees holding kernels/attention, got {t}")
    from repro.bench.fig5 import workload
    lengths = workload(args.scale)
    cfg = [lengths, args.passes, 16, 4, 32, args.reps]
    a, b = [], []
    for r in range(args.rounds):
        for tree, acc in ((args.a, a), (args.b, b)) if r % 2 == 0 else ((args.b, b), (args.a, a)):
            acc.append(sample(tree, cfg))
        print(f"round {r}: A {a[-1]:.3f} s  B {b[-1]:.3f} s", flush=True)
    ratio = statistics.median(b) / statistics.median(a)
    paired = sorted(y / x for x, y in zip(a, b))
    res = {"label": "cpu-emulated", "what": "TTT fwd+bwd, one rank, cpu-tiny shapes, auto backend (sdpa_cpu)",
           "tokens": sum(lengths), "lengths": lengths, "passes": args.passes, "a": str(args.a), "b": str(args.b),
           "samples_a_s": a, "samples_b_s": b, "median_a_s": statistics.median(a),
           "median_b_s": statistics.median(b), "ratio_b_over_a": ratio,
           "paired_ratios_b_over_a": paired, "paired_ratio_median": statistics.median(paired)}
    print(f"median A {res['median_a_s']:.3f} s, B {res['median_b_s']:.3f} s, B/A = {ratio:.3f}; per-round B/A "
          f"median {res['paired_ratio_median']:.3f} (range {paired[0]:.3f}..{paired[-1]:.3f})", flush=True)
    if args.out is not None:
        from repro.report.provenance import provenance, write_json_atomic
        write_json_atomic(args.out, {**res, "provenance": provenance()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
