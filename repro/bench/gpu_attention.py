"""One GPU session for CP attention (issue 3): check the GPU backends, then time Figure 6 at CP = 1.

1. Checks: the CUDA paths (flash ``sdpa_cuda`` for causal/full, ``prefix_full[sdpa_cuda]`` for the
   DFlash/DSpark prefix, bf16) against the fp64 dense reference on small packed batches, values and
   gradients; relative error = max |got - ref| / max(1, max |ref|), pass at <= 2e-2.
2. Timing on one GPU with the Qwen3-8B draft attention shape (32 query heads, 8 KV heads, head dim
   128, bf16), one document of T tokens, T = 16K..256K:
   - "ttt <T> cp=1": EAGLE-3 TTT, 3 passes, forward + backward (pass k: causal trunk over pass-0 K/V
     plus the k same-position branch keys), and "trunk <T> cp=1": the same 3 passes without the
     branch, in the same run (branch overhead = ttt / trunk - 1);
   - "sdpa <T> cp=1": one causal pass through F.scaled_dot_product_attention (flash), the floor;
   - "pass <T> <route> cp=1" (``--only pass``): one causal pass (forward, and forward + backward) through
     our backends, one row per ``--pass-routes`` entry, to find where the TTT trunk loses to SDPA:
     ``cudnn``, ``cudnn-rep`` (K/V repeated to the query heads instead of cuDNN's native GQA),
     ``tiled[cudnn]@TILE/KV`` (backward tiles of TILE rows x KV keys; KV 0 = keys uncut);
   - "block <T> cp=1": DFlash/DSpark block attention, 64 anchors x 16 slots, forward + backward,
     with a CUDA-kernel count and busy time (torch.profiler) to show where it is launch-bound.
   Gradients are consumed as they arrive (a post-accumulate hook frees each leaf's .grad, as the
   projections upstream would), so peak memory = inputs + saved activations + the kernels' workspace.
   With --bwd-tile N the TTT/trunk rows run the backward in N x N tiles (tiled[<backend>],
   kernels/attention/backends/tiled.py); each "ttt" row also records model_peak_gb, the peak that
   repro/bench/attention_memory.py predicts for it (meta tensors, cuDNN workspace model).
3. Optional: --flex-checks adds the flex_attention backend (compiled) to the checks, and reports
   which compile/backward route ran; --block-backend NAME times the block rows on NAME (e.g. flex).
Writes <out>/checks.json and the run folder <out>/fig6/ (bench.json, env.json, metrics.jsonl).

    PYTHONUNBUFFERED=1 WANDB_MODE=disabled python3 -m repro.bench.gpu_attention --out "$OUT"
    ... --ttt-backend best --bwd-tile 16384 --only ttt --sizes 256K         # the memory plan's path
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
import traceback
from pathlib import Path

import torch

from kernels.attention import RingStats, block_draft_attention, causal_attention, eagle3_ttt_attention
from kernels.attention.backends import NAMES
from kernels.attention.cost_model import attention_flops
from kernels.attention.selfcheck import Case, run_case
from repro.bench.common import BenchRun, PeakMemory, summarize, time_samples
from repro.report.provenance import provenance, write_json_atomic

H, G, D = 32, 8, 128
SIZES = {"16K": 16384, "32K": 32768, "64K": 65536, "128K": 131072, "256K": 262144}
REL_TOL = 2e-2
DEVICE = "cuda"          # --device cpu runs a smoke test of this script's logic (no timing claims)


def run_checks(out: Path, flex: bool = False) -> dict:
    from kernels.attention.backends import get
    from kernels.attention.backends.tiled import TiledBackward
    big = {"heads": H, "kv_heads": G, "dim": D, "dtype": "bfloat16", "device": DEVICE}
    lengths = (5, 300, 77, 1000)
    cases = {
        "ttt1": Case("ttt", lengths=lengths, passes=1, **big),
        "ttt3": Case("ttt", lengths=lengths, passes=3, **big),
        "ttt3_small_heads": Case("ttt", lengths=(3, 64, 130), passes=3, heads=4, kv_heads=2, dim=64,
                                 dtype="bfloat16", device=DEVICE),
        "block16": Case("block", lengths=lengths, block=16, invalid_blocks=(1,), slot_drop=0.2, **big),
        "block_edges": Case("block", lengths=lengths, block=7, anchors=(0, 4, 5, 6, 304, 305, 381, 382, 1381),
                            **big),
        "ttt3_torch_fp32": Case("ttt", lengths=(3, 64, 130), passes=3, dtype="float32", device=DEVICE,
                                backend="torch"),
    }
    base = dict(cases)         # the backend variants below are these cases on another backend
    variant = lambda name, backend: dataclasses.replace(base[name], backend=backend)
    if DEVICE == "cuda":
        cases.update({f"cudnn_{n}": variant(n, "cudnn") for n in ("ttt1", "ttt3", "ttt3_small_heads")})
        cases["cudnn_block16"] = variant("block16", "prefix_full[cudnn]")
        # tiled backward at a tile that cuts the 1000-token document into 8 x 8 tiles, dk/dv
        # summed in bf16 (the memory plan's default) and in fp32
        cases["tiled_cudnn_ttt3"] = variant("ttt3", TiledBackward(get("cudnn"), 128))
        cases["tiled_cudnn_ttt3_fp32acc"] = variant("ttt3", TiledBackward(get("cudnn"), 128, "fp32"))
        cases["tiled_sdpa_cuda_ttt3"] = variant("ttt3", TiledBackward(get("sdpa_cuda"), 128))
    if flex:
        cases.update({f"flex_{n}": variant(n, "flex")
                      for n in ("ttt1", "ttt3", "ttt3_small_heads", "block16", "block_edges")})
        cases["flex_ttt3_fp32"] = variant("ttt3_torch_fp32", "flex")
    res = {}
    for name, case in cases.items():
        t0 = time.perf_counter()
        try:
            r = run_case(0, 1, case)
            denom = max(1.0, max(r["ref_max"].values()))
            rel = {k: v / denom for k, v in r["err"].items()}
            res[name] = {"ok": all(v <= REL_TOL for v in rel.values()), "rel_err": rel, "abs_err": r["err"],
                         "ref_max": r["ref_max"], "seconds": time.perf_counter() - t0}
        except Exception as exc:  # noqa: BLE001 -- keep going: the report says which check failed and why
            res[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
        print(f"[check] {name}: {res[name].get('ok')} {res[name].get('rel_err', res[name].get('error'))}",
              flush=True)
    res["sdpa_cuda_gqa_native"] = get("sdpa_cuda").gqa_native
    res["cudnn_gqa_native"] = get("cudnn").gqa_native
    if flex:
        res["flex_routes"] = dict(get("flex").used)        # compiled/eager per step, backward "hop"/"recompute"
    write_json_atomic(out / "checks.json", {"checks": res, "tolerance_rel": REL_TOL, "provenance": provenance()})
    return res


def _leaf(*shape, gen, consume=True):
    x = torch.randn(*shape, device=DEVICE, dtype=torch.bfloat16, generator=gen).requires_grad_()
    if consume:
        x.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    return x


def _gb(*ts) -> float:
    return sum(t.numel() * t.element_size() for t in ts) / 1e9


def _measure(bench: BenchRun, row: str, params: dict, step, repeats: int, warmup: int, extra: dict):
    samples = time_samples(step, warmup=warmup, repeats=repeats, device=DEVICE)
    with PeakMemory(DEVICE) as pm:
        step()
    med = summarize(samples)["median"]
    ex = dict(extra)
    ex["peak_mem_gb"] = pm.peak_gb
    if "flops" in ex:
        ex["tflops"] = ex.pop("flops") / med / 1e12
    return bench.record(row, params, samples, extra=ex)


def _ttt_backend(name: str, tile: int, kv_tile, grad_acc: str):
    """The TTT rows' backend: a name, or tiled[name] with the given tile sizes."""
    if not tile:
        return name
    from kernels.attention.backends import get, select
    from kernels.attention.backends.tiled import TiledBackward
    from kernels.attention.spec import MaskSpec
    inner = (get(name) if name != "auto"
             else select("auto", MaskSpec.causal(torch.tensor([0, 1])), torch.device(DEVICE), torch.bfloat16))
    return TiledBackward(inner, tile, grad_acc, kv_tile)


def _model_peak_gb(T: int, passes: int, backend, step: str) -> float:
    """attention_memory.py's prediction for this row (meta tensors; cuDNN workspace model where cuDNN runs)."""
    from kernels.attention.backends import get
    from repro.bench.attention_memory import fresh, ttt_step_peak
    if backend == "auto":
        backend = "sdpa_cuda" if DEVICE == "cuda" else "torch_bf16"
    b = fresh(get(backend) if isinstance(backend, str) else backend)
    ws = "cudnn-h200" if "cudnn" in b.name else "none"
    return ttt_step_peak(T, passes, b, "meta", torch.bfloat16, step, ws)["peak_bytes"] / 1e9


def bench_ttt(bench: BenchRun, tag: str, T: int, passes: int, repeats: int, backend="auto", tiling: dict | None = None
              ) -> dict:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    cu = torch.tensor([0, T])
    qs = [_leaf(T, H, D, gen=gen) for _ in range(passes)]
    ks = [_leaf(T, G, D, gen=gen) for _ in range(passes)]
    vs = [_leaf(T, G, D, gen=gen) for _ in range(passes)]
    dout = torch.randn(T, H, D, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    inputs_gb = _gb(*qs, *ks, *vs, dout)
    pairs = passes * T * (T + 1) // 2
    flops = attention_flops(pairs, H, D, "fwd") + attention_flops(pairs, H, D, "bwd")

    def ttt():
        outs = [eagle3_ttt_attention(qs[p], ks[:p + 1], vs[:p + 1], cu, backend=backend) for p in range(passes)]
        torch.autograd.backward(outs, [dout] * passes)

    def trunk():
        outs = [causal_attention(qs[p], ks[p], vs[p], cu, backend=backend) for p in range(passes)]
        torch.autograd.backward(outs, [dout] * passes)

    bname = backend if isinstance(backend, str) else backend.name
    params = {"tokens": T, "passes": passes, "cp": 1, "heads": H, "kv_heads": G, "head_dim": D,
              "dtype": "bfloat16", "docs": 1, "grads": "consumed by hooks", "backend": bname, **(tiling or {})}
    model = {}
    for step in ("trunk", "ttt"):
        try:
            model[step] = {"model_peak_gb": _model_peak_gb(T, passes, backend, step)}
        except Exception as exc:  # noqa: BLE001 -- the model is a side note; the measurement must go on
            print(f"[model] {step} {tag}: {type(exc).__name__}: {exc}", flush=True)
            model[step] = {}
    r_tr = _measure(bench, f"trunk {tag} cp=1", {**params, "branch": False}, trunk, repeats, 1,
                    {"inputs_gb": inputs_gb, "flops": flops, **model["trunk"]})
    r_tt = _measure(bench, f"ttt {tag} cp=1", {**params, "branch": True}, ttt, repeats, 1,
                    {"inputs_gb": inputs_gb, "flops": flops, **model["ttt"]})
    over = r_tt["metrics"]["time_s"] / r_tr["metrics"]["time_s"] - 1
    bench.record(f"ttt {tag} cp=1", {**params, "derived": "branch overhead vs trunk-only, same run"},
                 extra={"branch_overhead_pct": 100 * over})
    return {"ttt": r_tt, "trunk": r_tr}


def bench_sdpa(bench: BenchRun, tag: str, T: int, repeats: int, kernel: str = "flash") -> None:
    """One causal pass through F.scaled_dot_product_attention (flash kernel, or default dispatch)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    q = _leaf(1, H, T, D, gen=gen)
    k = _leaf(1, G, T, D, gen=gen)
    v = _leaf(1, G, T, D, gen=gen)
    dout = torch.randn(1, H, T, D, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    mode = {"gqa": "enable_gqa"}

    allowed = {"flash": [SDPBackend.FLASH_ATTENTION], "cudnn": [SDPBackend.CUDNN_ATTENTION],
               "default": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                           SDPBackend.MATH]}[kernel]

    def step():
        with sdpa_kernel(allowed):
            if mode["gqa"] == "enable_gqa":
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                o = torch.nn.functional.scaled_dot_product_attention(
                    q, k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1), is_causal=True)
        o.backward(dout)

    try:
        step()
    except RuntimeError:
        mode["gqa"] = "repeat_kv"
    pairs = T * (T + 1) // 2
    flops = attention_flops(pairs, H, D, "fwd") + attention_flops(pairs, H, D, "bwd")
    row = f"sdpa {tag} cp=1" if kernel == "flash" else f"sdpa_{kernel} {tag} cp=1"
    _measure(bench, row, {"tokens": T, "passes": 1, "gqa": mode["gqa"], "kernel": kernel, "heads": H,
                                         "kv_heads": G, "head_dim": D},
             step, repeats, 1, {"inputs_gb": _gb(q, k, v, dout), "flops": flops})


def pass_backend(route: str):
    """A backend for one "pass" row: ``NAME``, ``NAME-rep`` (GQA by repeated K/V) or ``tiled[NAME]@TILE/KV``."""
    from kernels.attention.backends import get
    from kernels.attention.backends.tiled import TiledBackward
    m = re.fullmatch(r"tiled\[([\w-]+)\]@(\d+)/(\d+)", route)
    if m:
        return TiledBackward(pass_backend(m.group(1)), int(m.group(2)), "input", int(m.group(3)))
    name, rep = (route[:-4], True) if route.endswith("-rep") else (route, False)
    b = type(get(name))()                     # a fresh instance: its GQA probe is this row's own
    if rep:
        if not hasattr(b, "gqa_native"):
            raise ValueError(f"pass route {route!r}: backend {name!r} has no GQA switch")
        b.gqa_native = False
    return b


def bench_pass(bench: BenchRun, tag: str, T: int, route: str, repeats: int) -> None:
    """One causal pass (32/8 heads) through ``pass_backend(route)``: forward alone, then forward + backward."""
    backend = pass_backend(route)
    gen = torch.Generator(device=DEVICE).manual_seed(4)
    cu = torch.tensor([0, T])
    q, k, v = _leaf(T, H, D, gen=gen), _leaf(T, G, D, gen=gen), _leaf(T, G, D, gen=gen)
    dout = torch.randn(T, H, D, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    pairs = T * (T + 1) // 2
    params = {"tokens": T, "passes": 1, "cp": 1, "heads": H, "kv_heads": G, "head_dim": D, "route": route,
              "backend": backend.name}

    def fwd():
        with torch.no_grad():
            causal_attention(q, k, v, cu, backend=backend)

    def fwd_bwd():
        causal_attention(q, k, v, cu, backend=backend).backward(dout)

    _measure(bench, f"pass_fwd {tag} {route} cp=1", params, fwd, repeats, 1,
             {"flops": attention_flops(pairs, H, D, "fwd")})
    _measure(bench, f"pass {tag} {route} cp=1", params, fwd_bwd, repeats, 1,
             {"inputs_gb": _gb(q, k, v, dout),
              "flops": attention_flops(pairs, H, D, "fwd") + attention_flops(pairs, H, D, "bwd")})


def _kernel_profile(step) -> dict:
    """CUDA kernels launched by one step and their summed device time (None where unavailable)."""
    try:
        from torch.profiler import ProfilerActivity, profile
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            step()
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        evs = [e for e in prof.events() if getattr(e, "device_type", None) is not None
               and str(e.device_type).endswith("CUDA")]
        busy = sum(getattr(e, "device_time", getattr(e, "cuda_time", 0.0)) for e in evs) / 1e6
        return {"cuda_kernels": float(len(evs)), "kernel_busy_s": busy, "profiled_wall_s": wall}
    except Exception as exc:  # noqa: BLE001 -- profiler unavailable on this runtime: report without it
        print(f"[profile] unavailable: {exc}", flush=True)
        return {}


def bench_block(bench: BenchRun, tag: str, T: int, anchors_n: int, B: int, repeats: int, backend: str = "auto") -> None:
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    cpu_gen = torch.Generator().manual_seed(3)
    cu = torch.tensor([0, T])
    anchors = torch.sort(torch.randperm(T - B, generator=cpu_gen)[:anchors_n] + 1).values
    q = _leaf(anchors_n, B, H, D, gen=gen)
    k, v = _leaf(anchors_n, B, G, D, gen=gen), _leaf(anchors_n, B, G, D, gen=gen)
    ck, cv = _leaf(T, G, D, gen=gen), _leaf(T, G, D, gen=gen)
    dout = torch.randn(anchors_n, B, H, D, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    stats = RingStats()
    block_draft_attention(q, k, v, ck, cv, anchors, cu, stats=stats, backend=backend)
    pairs = stats.pairs["fwd"] + anchors_n * B * B
    flops = attention_flops(pairs, H, D, "fwd") + attention_flops(pairs, H, D, "bwd")

    def step():
        block_draft_attention(q, k, v, ck, cv, anchors, cu, backend=backend).backward(dout)

    extra = {"inputs_gb": _gb(q, k, v, ck, cv, dout), "flops": flops, "visible_pairs": float(pairs)}
    bparams = {"tokens": T, "anchors": anchors_n, "block": B, "cp": 1, "heads": H, "kv_heads": G, "head_dim": D}
    if backend != "auto":
        bparams["backend"] = backend
    rec = _measure(bench, f"block {tag} cp=1", bparams, step, repeats, 3, extra)
    prof = _kernel_profile(step)
    if prof:
        prof["busy_fraction"] = prof["kernel_busy_s"] / rec["metrics"]["time_s"]
        bench.record(f"block {tag} cp=1", {"derived": "torch.profiler, one step"}, extra=prof)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for checks.json and the fig6/ run folder")
    ap.add_argument("--profile", default="h200", help="profile name recorded with the run (default h200)")
    ap.add_argument("--sizes", default=",".join(SIZES), help=f"comma list out of {list(SIZES)}")
    ap.add_argument("--passes", type=int, default=3, help="TTT passes (default 3)")
    ap.add_argument("--anchors", type=int, default=64, help="blocks per sequence (default 64)")
    ap.add_argument("--block", type=int, default=16, help="block size B (default 16)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="skip remaining configs after this many seconds")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--ttt-backend", default="auto",
                    help="backend for the TTT/trunk rows: a backend name, a --pass-routes route (e.g. "
                         "'tiled[cudnn-rep]@16384/0'; then --bwd-tile is not used), or 'best' = cudnn if its "
                         "checks pass, else auto")
    ap.add_argument("--only", default="block,ttt,sdpa", help="which benchmark groups to run (block,ttt,sdpa,pass)")
    ap.add_argument("--bwd-tile", type=int, default=0,
                    help="TTT/trunk rows: backward in tiles of this many rows (tiled[<ttt backend>]); 0 = off")
    ap.add_argument("--kv-tile", type=int, default=None, help="keys per backward tile (default --bwd-tile; 0: uncut)")
    ap.add_argument("--grad-acc", choices=["input", "fp32"], default="input",
                    help="tiled backward: dk/dv summed over query tiles in bf16 (input) or fp32")
    ap.add_argument("--flex-checks", action="store_true", help="add the flex_attention backend to the checks")
    ap.add_argument("--branch-chunk-rows", type=int, default=0,
                    help="TTT branch rows per chunk (default: the library's, 2048 at this shape); larger = fewer "
                         "kernel launches, more temporary memory")
    ap.add_argument("--block-backend", default="auto", help="backend of the block rows (e.g. flex)")
    ap.add_argument("--sdpa-kernels", default="flash", help="comma list of flash,cudnn,default")
    ap.add_argument("--pass-routes", default="cudnn,cudnn-rep,tiled[cudnn]@16384/16384,tiled[cudnn]@16384/0",
                    help="--only pass: comma list of routes (NAME, NAME-rep, tiled[NAME]@TILE/KV)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: smoke-test the script with --tokens (results are not benchmarks)")
    ap.add_argument("--tokens", default=None, help="override sizes with token counts, e.g. 512,1024 (smoke tests)")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_attention needs a CUDA device (run it on the device machine, or --device cpu)")
    if args.tokens:
        SIZES.clear()
        SIZES.update({t.strip(): int(t) for t in args.tokens.split(",")})
        args.sizes = args.tokens
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        raise SystemExit(f"--sizes: unknown {bad}; expected a subset of {list(SIZES)}")
    t_start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    checks = {} if args.skip_checks else run_checks(args.out, flex=args.flex_checks)
    ttt_backend = args.ttt_backend
    if ttt_backend == "best":
        cud = [v for k, v in checks.items() if k.startswith("cudnn_") and k != "cudnn_gqa_native"]
        ttt_backend = "cudnn" if cud and all(c.get("ok") for c in cud) else "auto"
        print(f"[backend] ttt rows use {ttt_backend}", flush=True)
    cfg = {"heads": H, "kv_heads": G, "head_dim": D, "dtype": "bfloat16", "passes": args.passes,
           "anchors": args.anchors, "block": args.block, "sizes": sizes, "cp": 1, "ttt_backend": ttt_backend}
    tiling = {}
    if args.bwd_tile:
        tiling = {"bwd_tile": args.bwd_tile, "kv_tile": args.kv_tile if args.kv_tile is not None else args.bwd_tile,
                  "grad_acc": args.grad_acc}
        cfg.update(tiling)
    if args.block_backend != "auto":
        cfg["block_backend"] = args.block_backend
    if args.branch_chunk_rows:
        from kernels.attention.branch import TTTBranch
        TTTBranch.chunk_elems_default = args.branch_chunk_rows * H * D
        cfg["branch_chunk_rows"] = args.branch_chunk_rows
    if ttt_backend in NAMES:
        ttt_impl = _ttt_backend(ttt_backend, args.bwd_tile, args.kv_tile, args.grad_acc)
    else:
        if args.bwd_tile:
            raise SystemExit(f"--ttt-backend {ttt_backend!r} is a route with its own tiles; drop --bwd-tile")
        ttt_impl = pass_backend(ttt_backend)
        tiling = {"route": ttt_backend}
        cfg.update(tiling)
    with BenchRun(args.out / "fig6", artifact="fig6", profile=args.profile, config=cfg) as bench:
        groups = set(args.only.split(","))
        plan = ([("block", s) for s in sizes if "block" in groups] + [("ttt", s) for s in sizes if "ttt" in groups]
                + [(f"sdpa:{k}", s) for k in args.sdpa_kernels.split(",") for s in sizes if "sdpa" in groups]
                + [(f"pass:{r}", s) for s in sizes for r in args.pass_routes.split(",") if "pass" in groups])
        for kind, tag in plan:
            if time.perf_counter() - t_start > args.budget_s:
                print(f"[budget] skipping {kind} {tag}", flush=True)
                continue
            T = SIZES[tag]
            try:
                if kind == "block":
                    bench_block(bench, tag, T, args.anchors, args.block, repeats=10, backend=args.block_backend)
                elif kind == "ttt":
                    bench_ttt(bench, tag, T, args.passes, repeats=3 if T < 262144 else 2, backend=ttt_impl,
                              tiling=tiling)
                elif kind.startswith("pass:"):
                    bench_pass(bench, tag, T, kind.split(":", 1)[1], repeats=2)
                else:
                    bench_sdpa(bench, tag, T, repeats=2, kernel=kind.split(":")[1])
            except Exception as exc:  # noqa: BLE001 -- one failed config (e.g. out of memory) must not lose the others
                print(f"[error] {kind} {tag}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}", flush=True)
                bench.record(f"{kind} {tag} cp=1", {"error": f"{type(exc).__name__}: {exc}"}, extra={"failed": 1.0})
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    print(f"[done] {time.perf_counter() - t_start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
