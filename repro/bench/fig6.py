"""Figure 6: draft-training attention at fixed global lengths across CP sizes.

Two workloads, one document of T tokens each, forward + backward, every CP size in a fresh process
group (one process per rank; gloo on CPU, NCCL on GPUs):
    ttt     EAGLE-3 TTT attention, 3 passes (kernels.attention.eagle3_ttt_attention)
    block   DFlash/DSpark block attention, ``--anchors`` blocks of ``--block`` slots
            (kernels.attention.block_draft_attention; blocks on the rank owning their anchor)
Logged rows: "<kind> <T> cp=<C>" with time_s (slowest rank) and peak_mem_gb (largest rank), and
"<kind> <T>" with speedup_cp<Cmax>_over_cp1 and parallel_efficiency_pct (= t1 / (C t_C) x 100);
"block cp=<Cmax>" max_time_s over the lengths. CPU runs are cpu-emulated (scaled lengths, small heads; speedups from the
critical path, the largest per-rank CPU time per step, as in fig5):
compare ratios, not times. One-GPU CP=1 numbers come from repro/bench/gpu_attention.py.

    python -m repro.bench.fig6 --profile cpu-tiny          # -> results/<hw>/cpu-tiny/fig6/
    python -m repro.bench.fig6 --cp 1,2 --tokens 1024       # quicker
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from kernels.attention import block_draft_attention, eagle3_ttt_attention, make_layout
from kernels.launch import spawn
from repro.bench.fig5 import consumed_leaf, critical_path, timed_samples
from repro.core.provenance import hardware
from repro.core.timing import BenchRun, PeakMemory, summarize

DEFAULTS = {
    "cpu-tiny": {"tokens": [1024, 2048, 4096], "cp": [1, 2, 4], "heads": 8, "kv_heads": 2, "head_dim": 32,
                 "dtype": "float32", "anchors": 64, "block": 16, "repeats": 3, "warmup": 1},
    "h200": {"tokens": [16384, 32768, 65536, 131072, 262144], "cp": [1, 2, 4, 8], "heads": 32, "kv_heads": 8,
             "head_dim": 128, "dtype": "bfloat16", "anchors": 64, "block": 16, "repeats": 3, "warmup": 1},
}


def tag(T: int) -> str:
    return f"{T // 1024}K" if T % 1024 == 0 else str(T)


def worker(rank: int, world: int, cfg: dict) -> dict:
    H, G, D = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    dtype, device = getattr(torch, cfg["dtype"]), torch.device(cfg["device"])
    group = dist.group.WORLD if world > 1 else None
    T = cfg["tokens"]
    cu = torch.tensor([0, T])
    gen = torch.Generator().manual_seed(rank)
    with PeakMemory(device) as pm:
        lay = make_layout(cu, group)
        n = lay.num_local
        if cfg["kind"] == "ttt":
            P = cfg["passes"]
            qs = [consumed_leaf((n, H, D), dtype, device, gen) for _ in range(P)]
            ks = [consumed_leaf((n, G, D), dtype, device, gen) for _ in range(P)]
            vs = [consumed_leaf((n, G, D), dtype, device, gen) for _ in range(P)]
            dout = torch.randn(n, H, D, generator=gen).to(device, dtype)

            def step():
                outs = [eagle3_ttt_attention(qs[p], ks[:p + 1], vs[:p + 1], lay, group) for p in range(P)]
                torch.autograd.backward(outs, [dout] * P)
        else:
            B, A = cfg["block"], cfg["anchors"]
            anchors = torch.sort(torch.randperm(T - B, generator=torch.Generator().manual_seed(7))[:A] + 1).values
            mine = anchors[lay.locate(anchors)[2] == lay.rank]
            nb = mine.numel()
            q = consumed_leaf((nb, B, H, D), dtype, device, gen)
            k, v = consumed_leaf((nb, B, G, D), dtype, device, gen), consumed_leaf((nb, B, G, D), dtype, device, gen)
            ck, cv = consumed_leaf((n, G, D), dtype, device, gen), consumed_leaf((n, G, D), dtype, device, gen)
            dout = torch.randn(nb, B, H, D, generator=gen).to(device, dtype)

            def step():
                block_draft_attention(q, k, v, ck, cv, mine, lay, group).backward(dout)
        step()
    samples, cpu = timed_samples(step, cfg, device)
    return {"samples": samples, "cpu_s": cpu, "peak_gb": pm.peak_gb, "local_tokens": n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Figure 6: TTT and block-draft attention across CP sizes.")
    ap.add_argument("--profile", default="cpu-tiny", choices=sorted(DEFAULTS))
    ap.add_argument("--out", type=Path, default=None, help="run folder (default results/<hw>/<profile>/fig6)")
    ap.add_argument("--cp", default=None, help="comma list of CP sizes (must include 1 for efficiencies)")
    ap.add_argument("--tokens", default=None, help="comma list of global lengths")
    ap.add_argument("--kinds", default="ttt,block")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    args = ap.parse_args(argv)
    d = dict(DEFAULTS[args.profile])
    cps = [int(c) for c in args.cp.split(",")] if args.cp else d["cp"]
    sizes = [int(t) for t in args.tokens.split(",")] if args.tokens else d["tokens"]
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in ("ttt", "block")]
    if bad:
        raise SystemExit(f"--kinds: unknown {bad}; expected ttt and/or block")
    if args.repeats is not None:
        d["repeats"] = args.repeats
    device = "cpu" if args.profile == "cpu-tiny" else "cuda"
    if device == "cuda" and torch.cuda.device_count() < max(cps):
        raise SystemExit(f"CP={max(cps)} needs {max(cps)} GPUs, found {torch.cuda.device_count()}")
    out = args.out or Path("results") / hardware()["tag"] / args.profile / "fig6"
    config = {**{k: d[k] for k in ("heads", "kv_heads", "head_dim", "dtype", "anchors", "block", "repeats",
                                   "warmup")}, "cp": cps, "tokens": sizes, "kinds": kinds, "passes": args.passes,
              "device": device, "documents": 1}
    with BenchRun(out, artifact="fig6", profile=args.profile, config=config) as bench:
        for kind in kinds:
            worst = {}
            for T in sizes:
                times = {}
                for C in cps:
                    cfg = {**config, "kind": kind, "tokens": T}
                    res = spawn(worker, C, args=(cfg,), timeout_s=args.timeout_s)
                    samples = res[0]["samples"]
                    crit = critical_path(res)
                    emulated = device == "cpu"          # CPU-time critical path on CPUs (see fig5)
                    times[C] = summarize(crit if emulated else samples)["median"]
                    worst[C] = max(worst.get(C, 0.0), times[C])
                    bench.record(f"{kind} {tag(T)} cp={C}", {"kind": kind, "tokens": T, "cp": C,
                                                              "cpu_critical_samples": crit},
                                 samples, extra={"peak_mem_gb": max(r["peak_gb"] for r in res),
                                                 "local_tokens": res[0]["local_tokens"],
                                                 "cpu_critical_s": summarize(crit)["median"]})
                if 1 in times:
                    cmax = max(cps)
                    bench.record(f"{kind} {tag(T)}", {"kind": kind, "tokens": T, "cp_max": cmax},
                                 extra={f"speedup_cp{cmax}_over_cp1": times[1] / times[cmax],
                                        "parallel_efficiency_pct": 100 * times[1] / (cmax * times[cmax])})
            if kind == "block":
                for C in cps:
                    bench.record(f"block cp={C}", {"kind": kind, "over_tokens": sizes}, extra={"max_time_s": worst[C]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
