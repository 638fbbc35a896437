"""Figure 6: draft-training attention at fixed global lengths across CP sizes, with its peers in the same run.

One document of T tokens, forward + backward, per CP size C. Rows "<kind> <T> cp=<C>" (time_s: slowest rank;
peak_mem_gb: largest rank, the inputs counted (inputs_gb: rank 0's), gradients consumed as they arrive):
    ttt           EAGLE-3 TTT attention, ``passes`` passes (kernels.attention.eagle3_ttt_attention)
    trunk         the same passes without the branch keys (kernels.attention.causal_attention)
    sdpa_cudnn    the same passes through SDPA's cuDNN kernel (causal, GQA native): the peer a user would pick
    block_*       DFlash/DSpark block attention (``anchors`` blocks of ``block`` slots, each on the rank owning its
                  anchor), one row per ``block_routes`` entry (label -> a backend name for block_draft_attention, or
                  "fused": fused_block_draft_attention, one masked call each way, CP=1); "block" is the baseline
branch_impl / fold_impl: whether the TTT branch / the replicated route's fold ran on their Triton kernels.
Ratios, all between rows of this run: "ttt <T> cp=<C>" branch_overhead_pct = 100 (t_ttt / t_trunk - 1);
"trunk <T> cp=<C>" speedup_vs_sdpa_cudnn = t_sdpa_cudnn / t_trunk; "block_<route> <T> cp=<C>" speedup_vs_block =
t_block / t_route; "<kind> <T>" speedup_cp<Cmax>_over_cp1 and parallel_efficiency_pct (= t1 / (C t_C) x 100);
"block cp=<C>" max_time_s over the lengths. A route that cannot run is logged with its reason. At C = 1 on a GPU
every row runs in this process (peak memory per row from a reset of the allocator's peak); otherwise each row runs
in a fresh process group. CPU runs are cpu-emulated (speedups from the critical path, as in fig5). A run cut off
(killed, out of time) continues where it stopped when it is started again with the same settings at the same commit
(repro.core.timing.BenchRun's journal; bench.json's summary lists the rows measured by the earlier attempt).

    python -m repro.bench.fig6 --profile h200               # -> results/<hw>/h200/fig6/
    python -m repro.bench.fig6 --profile cpu-tiny           # -> results/<hw>/cpu-tiny/fig6/
    python -m repro.bench.fig6 --cp 1,2 --tokens 1024       # quicker
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from kernels.attention import backends, block_draft_attention, causal_attention, eagle3_ttt_attention, make_layout
from kernels.attention.backends.prefix_full import PrefixAsFull
from kernels.attention.branch import triton_kernels
from kernels.attention.spec import MaskSpec
from kernels.attention.triton_ops import load as triton_module
from kernels.launch import spawn
from repro.bench.fig5 import consumed_leaf, critical_path, timed_samples
from repro.core.profile import bench_settings, load_profile_model
from repro.core.provenance import hardware
from repro.core.timing import BenchRun, PeakMemory, summarize

KINDS = ("ttt", "trunk", "sdpa_cudnn", "block")


def tag(T: int) -> str:
    return f"{T // 1024}K" if T % 1024 == 0 else str(T)


def unavailable(kind: str, route: str | None, cfg: dict, C: int) -> str | None:
    """Why a row cannot run here (None: it can)."""
    device, dtype = torch.device(cfg["device"]), getattr(torch, cfg["dtype"])
    if kind == "sdpa_cudnn":
        if device.type != "cuda" or C != 1:
            return "SDPA's cuDNN kernel is timed at CP=1 on a GPU"
        return None
    if kind != "block" or route in (None, "auto"):
        return None
    name = "flash4" if route == "fused" else route
    if route == "fused" and C != 1:
        return "the one-call route runs at one rank"
    spec = MaskSpec.prefix(torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([1]))
    b = backends.get(name)
    if not b.supports(spec, device, dtype):
        return b.unavailable_reason(spec, device, dtype) or f"{name} does not run {dtype} on {device.type} here"
    return None


def _sdpa_cudnn(q, k, v):
    """One causal pass through SDPA's cuDNN kernel on [T, heads, D] rows (GQA native, else K/V repeated)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q4, k4, v4 = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        try:
            o = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, enable_gqa=True)
        except RuntimeError:
            rep = q.shape[1] // k.shape[1]
            o = F.scaled_dot_product_attention(q4, k4.repeat_interleave(rep, 1), v4.repeat_interleave(rep, 1),
                                               is_causal=True)
    return o[0].transpose(0, 1)


def _gb(*tensors) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 1e9


def build(cfg: dict, rank: int, group):
    """This rank's inputs and its step for one row: (step, local tokens, GB of the inputs)."""
    H, G, D = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    dtype, device = getattr(torch, cfg["dtype"]), torch.device(cfg["device"])
    T = cfg["tokens"]
    cu = torch.tensor([0, T])
    gen = torch.Generator().manual_seed(rank)
    lay = make_layout(cu, group)
    n = lay.num_local
    kind = cfg["kind"]
    if kind in ("ttt", "trunk", "sdpa_cudnn"):
        P = cfg["passes"]
        qs = [consumed_leaf((n, H, D), dtype, device, gen) for _ in range(P)]
        ks = [consumed_leaf((n, G, D), dtype, device, gen) for _ in range(P)]
        vs = [consumed_leaf((n, G, D), dtype, device, gen) for _ in range(P)]
        dout = torch.randn(n, H, D, generator=gen).to(device, dtype)
        if kind == "ttt":
            one = lambda p: eagle3_ttt_attention(qs[p], ks[:p + 1], vs[:p + 1], lay, group, backend=cfg["backend"])
        elif kind == "trunk":
            one = lambda p: causal_attention(qs[p], ks[p], vs[p], lay, group, backend=cfg["backend"])
        else:
            one = lambda p: _sdpa_cudnn(qs[p], ks[p], vs[p])

        def step():
            outs = [one(p) for p in range(P)]
            torch.autograd.backward(outs, [dout] * P)
        return step, n, _gb(*qs, *ks, *vs, dout)
    B, A = cfg["block"], cfg["anchors"]
    anchors = torch.sort(torch.randperm(T - B, generator=torch.Generator().manual_seed(7))[:A] + 1).values
    mine = anchors[lay.locate(anchors)[2] == lay.rank]
    nb = mine.numel()
    q = consumed_leaf((nb, B, H, D), dtype, device, gen)
    k, v = consumed_leaf((nb, B, G, D), dtype, device, gen), consumed_leaf((nb, B, G, D), dtype, device, gen)
    ck, cv = consumed_leaf((n, G, D), dtype, device, gen), consumed_leaf((n, G, D), dtype, device, gen)
    dout = torch.randn(nb, B, H, D, generator=gen).to(device, dtype)
    route = cfg["route"]
    if route == "fused":
        from kernels.attention.fused_block import fused_block_draft_attention

        def step():
            fused_block_draft_attention(q, k, v, ck, cv, mine, cu, backend="flash4").backward(dout)
    else:
        def step():
            block_draft_attention(q, k, v, ck, cv, mine, lay, group, backend=route).backward(dout)
    return step, n, _gb(q, k, v, ck, cv, dout)


def measure(rank: int, world: int, cfg: dict) -> dict:
    """One row on this rank: peak memory of the first step (inputs included), then the timed steps."""
    device = torch.device(cfg["device"])
    group = dist.group.WORLD if world > 1 else None
    with PeakMemory(device) as pm:
        step, n, inputs_gb = build(cfg, rank, group)
        step()
    samples, cpu = timed_samples(step, cfg, device)
    report = {"samples": samples, "cpu_s": cpu, "peak_gb": pm.peak_gb, "local_tokens": n, "inputs_gb": inputs_gb}
    if cfg["kind"] in ("ttt", "trunk") or cfg.get("route") not in (None, "fused"):
        name = cfg["backend"] if cfg["kind"] != "block" else cfg["route"]
        spec = (MaskSpec.causal(torch.tensor([0, n])) if cfg["kind"] != "block" else
                MaskSpec.prefix(torch.tensor([0, 1]), torch.tensor([0, n]), torch.tensor([n])))
        chosen = backends.select(name, spec, device, getattr(torch, cfg["dtype"]))
        report["backend_used"] = chosen.name
        if cfg["kind"] == "ttt":           # read after the steps: kernels that failed there read "torch"
            report["branch_impl"] = "triton" if device.type == "cuda" and triton_kernels() else "torch"
        if isinstance(chosen, PrefixAsFull):  # read after the steps, as branch_impl
            report["fold_impl"] = ("triton" if device.type == "cuda" and chosen.merge != "torch"
                                   and triton_module(chosen.KERNELS) else "torch")
        if getattr(chosen, "used", None):
            report["backend_report"] = {k: str(v) for k, v in chosen.used.items()}
    del step
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return report


def run_row(cfg: dict, C: int, timeout_s: float) -> list[dict]:
    """Per-rank results of one row: in this process at C = 1 on a GPU, else one fresh process per rank."""
    if C == 1 and cfg["device"] == "cuda":
        return [measure(0, 1, cfg)]
    return spawn(measure, C, args=(cfg,), timeout_s=timeout_s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Figure 6: TTT and block-draft attention across CP sizes.")
    ap.add_argument("--profile", default="cpu-tiny", help="profile name, or a path to a profile .yaml file")
    ap.add_argument("--out", type=Path, default=None, help="run folder (default results/<hw>/<profile>/fig6)")
    ap.add_argument("--cp", default=None, help="comma list of CP sizes (include 1 for the efficiencies)")
    ap.add_argument("--tokens", default=None, help="comma list of global lengths")
    ap.add_argument("--kinds", default=None, help=f"comma list of {KINDS} (default: the profile's)")
    ap.add_argument("--passes", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--no-resume", action="store_true",
                    help="measure every row again even if an interrupted attempt of this run left rows behind")
    args = ap.parse_args(argv)
    d = bench_settings(args.profile, "fig6")
    cps = [int(c) for c in args.cp.split(",")] if args.cp else d["cp"]
    sizes = [int(t) for t in args.tokens.split(",")] if args.tokens else d["tokens"]
    kinds = [k for k in args.kinds.split(",") if k] if args.kinds else d["kinds"]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise SystemExit(f"--kinds: unknown {bad}; expected some of {KINDS}")
    d.update({key: getattr(args, key) for key in ("passes", "repeats") if getattr(args, key) is not None})
    if min(cps) < 1 or min(sizes) < 2 * d["block"] or d["passes"] < 1:
        raise SystemExit(f"--cp {cps} / --tokens {sizes} / --passes {d['passes']} invalid: expected CP sizes >= 1, "
                         f"lengths >= {2 * d['block']} and at least one pass")
    device = load_profile_model(args.profile).hardware.device
    if device == "cuda" and torch.cuda.device_count() < max(cps):
        raise SystemExit(f"CP={max(cps)} needs {max(cps)} GPUs, found {torch.cuda.device_count()}")
    elif device == "cuda":
        os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")   # flash-attn-4: compile once
    out = args.out or Path("results") / hardware()["tag"] / load_profile_model(args.profile).name / "fig6"
    config = {**{k: d[k] for k in ("heads", "kv_heads", "head_dim", "dtype", "anchors", "block", "repeats",
                                   "warmup", "passes", "backend", "block_routes")},
              "cp": cps, "tokens": sizes, "kinds": kinds, "device": device, "documents": 1}
    emulated = device == "cpu"                  # CPU-time critical path on CPUs (see fig5)
    with BenchRun(out, artifact="fig6", profile=load_profile_model(args.profile).name, config=config,
                  resume=not args.no_resume) as bench:
        for T in sizes:
            times: dict = {}
            rows = [(k, None) for k in kinds if k != "block"]
            rows += [(label, route) for label, route in d["block_routes"].items()] if "block" in kinds else []
            for label, route in rows:
                kind = "block" if route is not None else label
                for C in cps:
                    name = f"{label} {tag(T)} cp={C}"
                    why = unavailable(kind, route, {**config, "device": device}, C)
                    params = {"kind": kind, "route": route, "tokens": T, "cp": C}
                    if why is not None:
                        bench.record(name, {**params, "skipped": why})
                        continue
                    earlier = bench.restored(name)           # measured by an interrupted attempt of this run
                    if earlier is not None:
                        times[(label, C)] = earlier["metrics"]["cpu_critical_s" if emulated else "time_s"]
                        continue
                    cfg = {**config, "kind": kind, "route": route, "tokens": T}
                    try:
                        res = run_row(cfg, C, args.timeout_s)
                    except Exception as exc:  # noqa: BLE001 -- one failing row must not lose the others' numbers
                        bench.record(name, {**params, "error": f"{type(exc).__name__}: {exc}"[:2000]})
                        del exc                      # its frames hold the row's tensors (in-process GPU rows)
                        gc.collect()
                        if device == "cuda":
                            torch.cuda.empty_cache()
                        continue
                    crit = critical_path(res)
                    times[(label, C)] = summarize(crit if emulated else res[0]["samples"])["median"]
                    extra = {"peak_mem_gb": max(r["peak_gb"] for r in res), "inputs_gb": res[0]["inputs_gb"],
                             "local_tokens": res[0]["local_tokens"], "cpu_critical_s": summarize(crit)["median"]}
                    bench.record(name, {**params, "cpu_critical_samples": crit,
                                        "backend_used": res[0].get("backend_used"),
                                        "backend_report": res[0].get("backend_report"),
                                        "branch_impl": res[0].get("branch_impl"),
                                        "fold_impl": res[0].get("fold_impl")},
                                 res[0]["samples"], extra=extra)
            record_ratios(bench, T, cps, times, d["block_routes"])
        record_scaling(bench, sizes, cps, kinds, d["block_routes"], bench.records)
    return 0


def record_ratios(bench: BenchRun, T: int, cps: list[int], times: dict, routes: dict) -> None:
    """The same-run comparisons at length T (see the module docstring)."""
    for C in cps:
        t = lambda label, C=C: times.get((label, C))
        if t("ttt") and t("trunk"):
            bench.record(f"ttt {tag(T)} cp={C}", {"tokens": T, "cp": C, "of": ["ttt", "trunk"]},
                         extra={"branch_overhead_pct": 100 * (t("ttt") / t("trunk") - 1)})
        if t("trunk") and t("sdpa_cudnn"):
            bench.record(f"trunk {tag(T)} cp={C}", {"tokens": T, "cp": C, "of": ["sdpa_cudnn", "trunk"]},
                         extra={"speedup_vs_sdpa_cudnn": t("sdpa_cudnn") / t("trunk")})
        for label in routes:
            if label != "block" and t(label) and t("block"):
                bench.record(f"{label} {tag(T)} cp={C}", {"tokens": T, "cp": C, "of": ["block", label]},
                             extra={"speedup_vs_block": t("block") / t(label)})


def record_scaling(bench: BenchRun, sizes: list[int], cps: list[int], kinds: list[str], routes: dict,
                   records: list[dict]) -> None:
    """CP scaling per kind and length, and the block routes' worst time over the lengths, per CP size."""
    basis = "cpu_critical_s" if bench.config["device"] == "cpu" else "time_s"
    time_of = {r["row"]: r["metrics"][basis] for r in records if basis in r.get("metrics", {})}
    labels = [k for k in kinds if k != "block"] + (list(routes) if "block" in kinds else [])
    cmax = max(cps)
    for label in labels:
        for T in sizes:
            t1, tc = time_of.get(f"{label} {tag(T)} cp=1"), time_of.get(f"{label} {tag(T)} cp={cmax}")
            if cmax > 1 and t1 and tc:
                bench.record(f"{label} {tag(T)}", {"kind": label, "tokens": T, "cp_max": cmax},
                             extra={f"speedup_cp{cmax}_over_cp1": t1 / tc,
                                    "parallel_efficiency_pct": 100 * t1 / (cmax * tc)})
        if label.startswith("block"):
            for C in cps:
                ts = [time_of.get(f"{label} {tag(T)} cp={C}") for T in sizes]
                if all(ts):
                    bench.record(f"{label} cp={C}", {"kind": label, "over_tokens": sizes},
                                 extra={"max_time_s": max(ts)})


if __name__ == "__main__":
    sys.exit(main())
