"""Figure 5: packed zigzag CP vs the best USP split (SpecForge), EAGLE-3 TTT with 3 passes.

A rollout-like packed batch (8 rollouts, longest 20,480 tokens, mean 0.444 of the longest: padding costs 2.25x)
is divided by ``--scale`` on CPUs. Methods: ``zigzag`` (packed THD, zigzag ring trunk + rank-local branch,
kernels.attention), ``usp U=.. R=..`` (SpecForge's USP on the padded batch, every U*R = C that divides the head
counts) and ``usp-zigzag`` (the same with yunchang's zigzag ring, R > 1). Each method's peak memory is measured in a
fresh process group (one process per rank; gloo on CPU), from the inputs through the first step after an untimed
warm-up step; all methods are timed in one process group in interleaved rounds, so a shared machine's drift falls
on all alike. The baseline is the best SpecForge USP row, as in the paper ("cp=<C>": speedup_vs_best_usp,
peak_mem_ratio_usp_over_zigzag, usp_pad_factor); the best of every USP row, ours included, is reported beside it
(``*_any``); "all" pools them. Times are forward + backward of the 3 passes: wall (slowest rank) and, on CPUs, the
critical path (largest per-rank CPU time per step), from which CPU runs compute the speedup. At C = 1 (one GPU)
each method runs in one process, so the ratio is packing against padding through the same kernels. CPU results
are cpu-emulated; cpu-tiny uses scale 4 (longest 5,120 tokens; 12-14 minutes on 2 cores): at scale 8 a CP=4
rank's chunks (47-320 tokens) are small for the fused CPU kernel and per-call overheads dominate.

    python -m repro.bench.fig5 --profile cpu-tiny              # -> results/<hw>/cpu-tiny/fig5/
    python -m repro.bench.fig5 --profile h200                  # CP=1 on one GPU -> results/<hw>/h200/fig5/
    python -m repro.bench.fig5 --cp 2 --scale 32 --repeats 2   # quicker
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from kernels.attention import eagle3_ttt_attention, make_layout
from kernels.attention.ring import RingStats
from kernels.attention.usp import UspBatch, make_usp_groups, usp_eagle3_ttt_attention, usp_splits
from kernels.launch import spawn
from repro.core.profile import bench_settings, load_profile_model
from repro.core.provenance import hardware
from repro.core.timing import BenchRun, PeakMemory, summarize, time_samples

LONGEST = 20480
FRACTIONS = (1.0, 0.70, 0.52, 0.42, 0.32, 0.25, 0.20, 0.145)     # mean 0.444 -> 2.25x padding
WARMUP_SCALE = 256      # the untimed warm-up step before the memory window: longest 80 tokens


def workload(scale: int) -> list[int]:
    """The packed batch's sequence lengths (longest = LONGEST / scale)."""
    if scale < 1:
        raise ValueError(f"--scale must be >= 1, got {scale}")
    longest = LONGEST // scale
    return [max(1, round(f * longest)) for f in FRACTIONS]


def consumed_leaf(shape, dtype, device, gen):
    """A random leaf tensor whose .grad is freed as soon as it is accumulated (upstream consumes it)."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float32).to(device, dtype).requires_grad_()
    x.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))   # consumed upstream
    return x


def build_step(cfg: dict, lengths: list[int], gen: torch.Generator, stats: RingStats, groups=None):
    """This rank's inputs for ``lengths`` and its step (TTT passes, fwd + bwd): (step, local tokens)."""
    H, G, D, P = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["passes"]
    dtype, device = getattr(torch, cfg["dtype"]), torch.device(cfg["device"])
    world = dist.get_world_size()
    if cfg["method"] == "zigzag":
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
        lay = make_layout(cu, dist.group.WORLD)
        T = lay.num_local
        qs = [consumed_leaf((T, H, D), dtype, device, gen) for _ in range(P)]
        ks = [consumed_leaf((T, G, D), dtype, device, gen) for _ in range(P)]
        vs = [consumed_leaf((T, G, D), dtype, device, gen) for _ in range(P)]
        dout = torch.randn(T, H, D, generator=gen).to(device, dtype)

        def step():
            outs = [eagle3_ttt_attention(qs[p], ks[:p + 1], vs[:p + 1], lay, dist.group.WORLD,
                                         backend=cfg["backend"], stats=stats) for p in range(P)]
            torch.autograd.backward(outs, [dout] * P)
        return step, T
    U = cfg["usp"][0]
    batch = UspBatch(lengths, world, ttt_length=P, ulysses=U, ring=cfg["usp_ring"])
    shp = (len(lengths), batch.chunk)
    qs = [consumed_leaf((*shp, H, D), dtype, device, gen) for _ in range(P)]
    ks = [consumed_leaf((*shp, G, D), dtype, device, gen) for _ in range(P)]
    vs = [consumed_leaf((*shp, G, D), dtype, device, gen) for _ in range(P)]
    dout = torch.randn(*shp, H, D, generator=gen).to(device, dtype)

    def step():
        cache: list = []
        outs = [usp_eagle3_ttt_attention(qs[p], ks[p], vs[p], cache, groups, backend=cfg["backend"],
                                         ring=cfg["usp_ring"], stats=stats) for p in range(P)]
        torch.autograd.backward(outs, [dout] * P)
    return step, shp[0] * shp[1]


def memory_worker(rank: int, world: int, cfg: dict) -> dict:
    """Peak memory of one method on one CP group (a fresh process group, so the peak is its alone).

    Before the memory window the method's process groups are made and one step runs on a tiny batch
    (WARMUP_SCALE): the same code path loads its kernels, code pages and library state (about 50 MB
    of resident set per process on CPUs, the same for every method), which are not the method's
    memory. The window then holds the inputs, the first step and everything it allocates.
    """
    device = torch.device(cfg["device"])
    if device.type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    gen = torch.Generator().manual_seed(rank)
    groups = make_usp_groups(*cfg["usp"]) if cfg["method"] == "usp" else None
    warm, _ = build_step(cfg, workload(WARMUP_SCALE), gen, RingStats(), groups)
    warm()
    del warm
    stats = RingStats()
    with PeakMemory(device) as pm:
        step, tokens = build_step(cfg, cfg["lengths"], gen, stats, groups)
        step()                                     # first step inside the memory window
    return {"rank": rank, "peak_gb": pm.peak_gb, "local_tokens": tokens, "stats": stats.as_dict()}


def timing_worker(rank: int, world: int, cfgs: list[dict]) -> list[dict]:
    """Every method of one CP size in one process group, timed in interleaved rounds.

    Round k times sample k of every method in turn, so slow periods of a shared machine fall on all
    methods alike. Returns, per method, the wall seconds per sample (slowest rank) and this rank's
    CPU seconds per sample (process time). With more ranks than cores, wall time measures the
    machine's total work, not C devices; the largest per-rank CPU time per sample is then the
    emulated critical path (``cpu_critical_s``).
    """
    device = torch.device(cfgs[0]["device"])
    if device.type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    gen = torch.Generator().manual_seed(rank)
    group = dist.group.WORLD if world > 1 else None
    steps, out = [], []
    for cfg in cfgs:
        groups = make_usp_groups(*cfg["usp"]) if cfg["method"] == "usp" else None
        step, _ = build_step(cfg, cfg["lengths"], gen, RingStats(), groups)
        steps.append(step)
        out.append({"samples": [], "cpu_s": []})
    for _ in range(cfgs[0]["warmup"]):
        for step in steps:
            step()
    for _ in range(cfgs[0]["repeats"]):
        for step, o in zip(steps, out):
            def timed(step=step, o=o):
                c = time.process_time()
                step()
                o["cpu_s"].append(time.process_time() - c)
            o["samples"] += time_samples(timed, warmup=0, repeats=1, device=device, group=group)
    return out


def timed_samples(step, cfg: dict, device) -> tuple[list[float], list[float]]:
    """Wall seconds per step (slowest rank) and this rank's CPU seconds per step (process time).

    With more ranks than cores, wall time measures the machine's total work, not C devices; the
    largest per-rank CPU time per step is then the emulated critical path (``cpu_critical_s``).
    (fig6 times its steps with this; fig5 interleaves its methods in timing_worker.)
    """
    cpu: list[float] = []

    def timed():
        c = time.process_time()
        step()
        cpu.append(time.process_time() - c)
    group = dist.group.WORLD if dist.is_initialized() and dist.get_world_size() > 1 else None
    samples = time_samples(timed, warmup=max(0, cfg["warmup"] - 1), repeats=cfg["repeats"], device=device,
                           group=group)
    return samples, cpu[-cfg["repeats"]:]


def critical_path(res: list[dict]) -> list[float]:
    """Per sample, the largest per-rank CPU time (see timing_worker)."""
    return [max(r["cpu_s"][i] for r in res) for i in range(len(res[0]["cpu_s"]))]


def run_cp(cfgs: list[dict], C: int, timeout_s: float) -> list[dict]:
    """Each method's peak memory (a fresh process group each) and interleaved timings (one group)."""
    timed = spawn(timing_worker, C, args=(cfgs,), timeout_s=timeout_s)
    results = []
    for i, cfg in enumerate(cfgs):
        mem = spawn(memory_worker, C, args=(cfg,), timeout_s=timeout_s)
        res = [t[i] for t in timed]
        samples = res[0]["samples"]                # already the slowest rank per sample
        peaks = [r["peak_gb"] for r in mem]
        crit = critical_path(res)
        emulated = cfg["device"] == "cpu"          # one basis on CPUs, robust to other load on a shared machine
        results.append({"samples": samples, "wall_median": summarize(samples)["median"], "cpu_critical": crit,
                        "cpu_critical_median": summarize(crit)["median"], "emulated": emulated,
                        "median": summarize(crit if emulated else samples)["median"], "peak_gb_max": max(peaks),
                        "peak_gb_per_rank": peaks, "local_tokens": mem[0]["local_tokens"],
                        "bytes": mem[0]["stats"]["bytes"]})
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Figure 5: packed zigzag CP vs best USP (EAGLE-3 TTT, 3 passes).")
    ap.add_argument("--profile", default="cpu-tiny", help="profile name, or a path to a profile .yaml file")
    ap.add_argument("--out", type=Path, default=None, help="run folder (default results/<hw>/<profile>/fig5)")
    ap.add_argument("--cp", default=None, help="comma list of CP sizes (default: the profile's)")
    ap.add_argument("--scale", type=int, default=None, help="divide the workload's lengths by this")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--backend", default=None, help="attention backend for both methods (default: the profile's)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="hard timeout per method run")
    args = ap.parse_args(argv)
    d = bench_settings(args.profile, "fig5")
    for key in ("scale", "repeats", "backend"):
        if getattr(args, key) is not None:
            d[key] = getattr(args, key)
    cps = [int(c) for c in args.cp.split(",")] if args.cp else d["cp"]
    device = load_profile_model(args.profile).hardware.device
    if min(cps) < 1:
        raise SystemExit(f"--cp {cps} is invalid: expected CP sizes >= 1")
    if device == "cuda" and torch.cuda.device_count() < max(cps):
        raise SystemExit(f"profile {args.profile} needs {max(cps)} GPUs for CP={max(cps)}, "
                         f"found {torch.cuda.device_count()}")
    if device == "cuda":
        os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")   # flash-attn-4: compile once
    lengths = workload(d["scale"])
    out = args.out or Path("results") / hardware()["tag"] / load_profile_model(args.profile).name / "fig5"
    base = {"usp_ring": "sequential", "heads": d["heads"], "kv_heads": d["kv_heads"], "head_dim": d["head_dim"],
            "dtype": d["dtype"],
            "passes": args.passes, "lengths": lengths, "device": device, "backend": d["backend"],
            "repeats": d["repeats"], "warmup": d["warmup"]}
    config = {**base, "cp": cps, "scale": d["scale"], "workload": "8 rollouts, fixed fractions of the longest",
              "memory_warmup_scale": WARMUP_SCALE,
              "fractions": list(FRACTIONS)}
    pooled_speedup, pooled_mem, pad = [], [], None
    with BenchRun(out, artifact="fig5", profile=load_profile_model(args.profile).name, config=config) as bench:
        for C in cps:
            methods = [("zigzag", None, None)] + [(("usp" if ring == "sequential" else "usp-zigzag"), (U, R), ring)
                                                   for U, R in usp_splits(C, d["heads"], d["kv_heads"])
                                                   for ring in (("sequential", "zigzag") if R > 1 else ("sequential",))]
            cfgs = [{**base, "method": "zigzag"} if m == "zigzag" else
                    {**base, "method": "usp", "usp": split, "usp_ring": ring} for m, split, ring in methods]
            z, *rest = run_cp(cfgs, C, args.timeout_s)
            bench.record(f"zigzag cp={C}", {"cp": C, "method": "zigzag", "cpu_critical_samples": z["cpu_critical"]},
                         z["samples"], extra={"peak_mem_gb": z["peak_gb_max"], "local_tokens": z["local_tokens"],
                                              "ring_bytes_fwd": z["bytes"]["fwd"],
                                              "cpu_critical_s": z["cpu_critical_median"]})
            usp = {}
            for (name, (U, R), ring), u in zip(methods[1:], rest):
                usp[(U, R, ring)] = u
                bench.record(f"{name} U={U} R={R} cp={C}", {"cp": C, "method": name, "U": U, "R": R, "ring": ring,
                                                            "cpu_critical_samples": u["cpu_critical"]},
                             u["samples"], extra={"peak_mem_gb": u["peak_gb_max"], "local_tokens": u["local_tokens"],
                                                  "cpu_critical_s": u["cpu_critical_median"]})
            # the paper's baseline: SpecForge's USP (sequential ring), best split; beside it the best of every
            # USP variant, ours with the zigzag ring included (a stronger baseline than the paper's)
            specforge = {k: u for k, u in usp.items() if k[2] == "sequential"}
            (bU, bR, bring), best = min(specforge.items(), key=lambda kv: kv[1]["median"])
            (aU, aR, aring), best_any = min(usp.items(), key=lambda kv: kv[1]["median"])
            pad = UspBatch(lengths, C, ttt_length=args.passes)     # SpecForge's padding (sequential ring)
            speedup = best["median"] / z["median"]
            mem_ratio = best["peak_gb_max"] / z["peak_gb_max"]
            pooled_speedup.append(speedup)
            pooled_mem.append(mem_ratio)
            best_wall = min(u["wall_median"] for u in specforge.values())
            timing = "cpu critical path (largest per-rank CPU time)" if z["emulated"] else "wall, slowest rank"
            bench.record(f"cp={C}", {"cp": C, "best_usp": [bU, bR, bring], "best_usp_any": [aU, aR, aring],
                                     "same_run": True, "speedup_timing": timing},
                         extra={"speedup_vs_best_usp": speedup, "peak_mem_ratio_usp_over_zigzag": mem_ratio,
                                "speedup_vs_best_usp_wall": best_wall / z["wall_median"],
                                "speedup_vs_best_usp_any": best_any["median"] / z["median"],
                                "peak_mem_ratio_usp_any_over_zigzag": best_any["peak_gb_max"] / z["peak_gb_max"],
                                "usp_pad_factor": pad.pad_factor,
                                "usp_pad_factor_with_overlap": pad.pad_factor_with_overlap})
        bench.record("all", {"cp": cps, "pooled": "smallest over CP sizes"},
                     extra={"speedup_vs_best_usp": min(pooled_speedup),
                            "peak_mem_ratio_usp_over_zigzag": min(pooled_mem),
                            "usp_pad_factor": pad.pad_factor, "longest_seq_tokens": max(lengths)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
