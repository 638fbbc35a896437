"""Correctness of every attention path on this machine's device, per available backend, against the fp64 oracle.

For each backend of the profile that runs here (flash4, cudnn, sdpa_cuda, flash_attn on GPUs, flex on request;
torch and sdpa_cpu on CPUs) it compares values and gradients with ``kernels.attention.reference.dense_attention`` in
fp64, computed from the same (rounded) inputs, as max |x - oracle| / max |oracle| per output and gradient:

    kernel    the backend contract on its own: causal over documents shorter and longer than a 128-row tile,
              full blocks with a segment without keys and one without queries (the ring's step shapes), prefix
              masks with rows that see nothing, one causal document; and the split-keys backward with the joint
              (out, lse); flash4
              also with its backward split into one call per K/V head (head slices read and written in place)
    trunk     causal attention (EAGLE-3 pass 0) through the front end
    ttt2/3    EAGLE-3 TTT passes 2 and 3 (trunk + branch keys, the trunk's backward fed the joint lse; on CUDA the
              branch runs on its Triton kernels)
    block     DFlash/DSpark blocks (anchors at document starts and ends, partly invalid slots, an invalid block)
              through block_draft_attention; flash4 also as prefix_full[flash4] and the one-call route
    padded    the drafts' right-padded block attention: SDPA default / deterministic / math, and flash4's call
              (how far two backward passes of the same inputs differ is recorded beside it)
    padded_ttt  EAGLE-3's right-padded TTT passes 2 and 3 (one masked SDPA each, the graphed training step's route):
              SDPA default / deterministic / math
    ring      the same trunk/TTT/block cases through a process group (kernels.launch.spawn) of 1 rank and, where
              there are enough devices (CPU: gloo), of 2 ranks
Rows without keys must come back as out = 0 and lse = -inf exactly (an lse of another sign or a NaN fails).
A backend the profile requires (flash4 on h200) that does not run here fails the check. Writes
<out>/attention_check.json (every row, the errors, the backends' own reports of what ran, provenance), prints
a verdict table and exits with status 1 when any row fails.

    python -m repro.bench.attention_check --profile h200 --out results/<hw>/h200/attention_check
    python -m repro.bench.attention_check --profile cpu-tiny --out /tmp/attention_check      # CPU backends, small
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from kernels.attention import backends
from kernels.attention.merge import merge
from kernels.attention.reference import block_mask, dense_attention, eagle3_ttt_mask
from kernels.attention.selfcheck import (
    Case,
    case_inputs,
    case_reference,
    run_case,
    run_cases,
    split_keys_backward,
)
from kernels.attention.spec import MaskSpec
from kernels.backend_names import prefix_full
from repro.core.io import write_json_atomic
from repro.core.profile import bench_settings
from repro.core.provenance import provenance

TOL = {"float64": 1e-9, "float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2}
PADDED_GRADS = ("q", "k", "v", "ctx_k", "ctx_v")


# -- errors -----------------------------------------------------------------------------------------------

def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| / max |ref| with -inf required at exactly the oracle's -inf entries (else inf)."""
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    if x.shape != ref.shape:
        raise AssertionError(f"shape {tuple(x.shape)} vs the oracle's {tuple(ref.shape)}")
    inf_x, inf_r = torch.isinf(x), torch.isinf(ref)
    if torch.isnan(x).any() or not torch.equal(inf_x, inf_r) or not torch.equal(x[inf_x], ref[inf_r]):
        return float("inf")
    fin = ~inf_r
    if not fin.any():
        return 0.0
    return float((x[fin] - ref[fin]).abs().max() / ref[fin].abs().max().clamp_min(1e-30))


_SCALE_KEYS = {"out": ("out",), "dq": ("dq",), "dk": ("dks", "dbk", "dck"), "dv": ("dvs", "dbv", "dcv")}


def _from_abs(res: dict) -> dict:
    """selfcheck's max-abs errors -> relative to the oracle's largest value (lse: absolute)."""
    scale = lambda n: max((res["ref_max"][k] for k in _SCALE_KEYS[n] if k in res["ref_max"]), default=1.0)
    return {n: e if n == "lse" else e / max(scale(n), 1e-30) for n, e in res["err"].items()}


# -- the checks -------------------------------------------------------------------------------------------

def kernel_specs(lengths: list[int]) -> dict[str, MaskSpec]:
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    n = len(lengths)
    lk = torch.tensor(lengths)
    lk[n // 2] = 0                                                     # a segment without keys
    lq = torch.tensor(lengths)
    lq[1] = 0                                                          # a segment without queries
    cq = torch.cat([torch.zeros(1, dtype=torch.int64), lq.cumsum(0)])
    ck = torch.cat([torch.zeros(1, dtype=torch.int64), lk.cumsum(0)])
    seg = torch.repeat_interleave(torch.arange(n), lq)
    g = torch.Generator().manual_seed(3)
    lo, hi = ck[seg], ck[seg + 1]
    ke = lo + (torch.rand(int(cq[-1]), generator=g) * (hi - lo + 1).double()).long()
    ke[::7] = lo[::7]                                                  # rows that see nothing
    return {"causal": MaskSpec.causal(cu), "full": MaskSpec.full(cq, ck), "prefix": MaskSpec.prefix(cq, ck, ke),
            "causal_one": MaskSpec.causal(cu[[0, -1]])}                 # one document (flash4's batched forward)


def check_kernel(backend, spec: MaskSpec, cfg: dict) -> dict:
    dev, dt = torch.device(cfg["device"]), getattr(torch, cfg["dtype"])
    H, G, D = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dt).double().to(dev)
    q, k, v, do = r(spec.num_q, H, D), r(spec.num_k, G, D), r(spec.num_k, G, D), r(spec.num_q, H, D)
    scale = D ** -0.5
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ro, rl = dense_attention(qr, kr, vr, spec.dense(dev), scale)
    rg = torch.autograd.grad(ro, [qr, kr, vr], do)
    c = lambda x: x.to(dt)
    out, lse = backend.forward(c(q), c(k), c(v), spec, scale)
    grads = backend.backward(c(do), c(q), c(k), c(v), out, lse, spec, scale)
    err = {"out": rel(out, ro), "lse": rel(lse, rl), **{f"d{n}": rel(a, b) for n, a, b in zip("qkv", grads, rg)}}
    if spec.kind == "full" and spec.num_k > 1:       # split keys in two, merge, backward of each part with the joint
        half = spec.cu_k.clamp(max=spec.num_k // 2)
        parts = [(torch.arange(0, spec.num_k // 2), MaskSpec.full(spec.cu_q, half)),
                 (torch.arange(spec.num_k // 2, spec.num_k), MaskSpec.full(spec.cu_q, spec.cu_k - half))]
        pieces = [backend.forward(c(q), c(k)[i.to(dev)], c(v)[i.to(dev)], s, scale) for i, s in parts]
        jo, jl = merge(*pieces[0], *pieces[1])
        parts_dev = [(i.to(dev), s) for i, s in parts]
        sg = split_keys_backward(backend, c(do), c(q), c(k), c(v), jo.to(dt), jl, parts_dev, scale)
        err.update({"split_out": rel(jo, ro), **{f"split_d{n}": rel(a, b) for n, a, b in zip("qkv", sg, rg)}})
    return err


def front_cases(cfg: dict) -> dict[str, Case]:
    base = {"lengths": tuple(cfg["lengths"]), "heads": cfg["heads"], "kv_heads": cfg["kv_heads"],
            "dim": cfg["head_dim"], "dtype": cfg["dtype"], "device": cfg["device"], "ref_device": cfg["device"]}
    cu = [0, *torch.tensor(cfg["lengths"]).cumsum(0).tolist()]
    anchors = sorted({a for s, e in itertools.pairwise(cu) if e > s for a in (s, (s + e) // 2, e - 1)})
    return {"trunk": Case("ttt", passes=1, **base), "ttt2": Case("ttt", passes=2, seed=2, **base),
            "ttt3": Case("ttt", passes=3, seed=3, **base),
            "block": Case("block", block=cfg["block"], anchors=tuple(anchors), invalid_blocks=(1,), slot_drop=0.3,
                          seed=4, **base)}


def check_front(backend: str, case: Case, ref) -> dict:
    import dataclasses
    return _from_abs(run_case(0, 1, dataclasses.replace(case, backend=backends.get(backend)), ref))


def check_fused(case: Case, ref) -> dict:
    from kernels.attention.fused_block import fused_block_draft_attention
    cu, t = case_inputs(case)
    dev, dt = torch.device(case.device), getattr(torch, case.dtype)
    leaf = lambda x: x.to(dev, dt).requires_grad_()
    q, bk, bv, ck, cv = (leaf(t[n]) for n in ("q", "bk", "bv", "ck", "cv"))
    out = fused_block_draft_attention(q, bk, bv, ck, cv, t["anchors"], cu, slot_valid=t["slot_valid"],
                                      block_valid=t["block_valid"], backend="flash4")
    g = torch.autograd.grad(out, [q, bk, bv, ck, cv], t["dout"].to(dev, dt))
    ref_out, _lse, rg = ref
    return {"out": rel(out, ref_out), **{f"d{n}": rel(a, rg[n]) for n, a in zip(("q", "bk", "bv", "ck", "cv"), g)}}


def padded_case(p: dict, cfg: dict, length: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    R, N, B, H, G, D = p["rows"], p["blocks"], p["block"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    dt = getattr(torch, cfg["dtype"])
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dt).double()
    case = {"q": r(R, N * B, H, D), "k": r(R, N * B, G, D), "v": r(R, N * B, G, D), "ctx_k": r(R, length, G, D),
            "ctx_v": r(R, length, G, D), "anchors": torch.randint(0, length, (R, N), generator=g),
            "valid": torch.ones(R, N, dtype=torch.bool), "grad_out": r(R, N * B, H, D)}
    case["valid"][:, -1] = False
    return case


def padded_oracle(case: dict, block: int, device) -> dict:
    """Output and gradients row by row from the fp64 dense oracle and its own block mask."""
    leaves = {n: case[n].to(device, copy=True).requires_grad_(True) for n in PADDED_GRADS}
    scale, length = case["q"].shape[-1] ** -0.5, case["ctx_k"].shape[1]
    outs = []
    for r in range(case["q"].shape[0]):
        mask = block_mask(torch.tensor([0, length]), case["anchors"][r], block, block_valid=case["valid"][r])
        keys = torch.cat([leaves["ctx_k"][r], leaves["k"][r]])
        vals = torch.cat([leaves["ctx_v"][r], leaves["v"][r]])
        outs.append(dense_attention(leaves["q"][r], keys, vals, mask.to(device), scale)[0])
    out = torch.stack(outs)
    out.backward(case["grad_out"].to(device))
    return {"out": out.detach(), **{n: leaves[n].grad for n in PADDED_GRADS}}


def run_padded(case: dict, mode: str, dtype: torch.dtype, device) -> dict:
    """The padded route under ``mode``: SDPA "default" / "deterministic" / "math", or "flash4"."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.attention.padded import padded_block_attention
    from repro.rl.sft import deterministic_algorithms
    leaves = {n: case[n].to(device, dtype, copy=True).requires_grad_(True) for n in PADDED_GRADS}
    anchors, valid = case["anchors"].to(device), case["valid"].to(device)
    ctx = sdpa_kernel([SDPBackend.MATH]) if mode == "math" else contextlib.nullcontext()
    with deterministic_algorithms(mode == "deterministic"), ctx:
        out = padded_block_attention(leaves["q"], leaves["k"], leaves["v"], leaves["ctx_k"], leaves["ctx_v"],
                                     anchors, valid, backend="flash4" if mode == "flash4" else "sdpa")
        out.backward(case["grad_out"].to(device, dtype))
    return {"out": out.detach(), **{n: leaves[n].grad for n in PADDED_GRADS}}


def check_padded(p: dict, cfg: dict, mode: str, oracles: dict) -> dict:
    dev, dt = torch.device(cfg["device"]), getattr(torch, cfg["dtype"])
    worst, spread = {}, 0.0
    for i, length in enumerate(p["lengths"]):
        case = padded_case(p, cfg, length, seed=i)
        if length not in oracles:
            oracles[length] = padded_oracle(case, p["block"], dev)
        first, again = run_padded(case, mode, dt, dev), run_padded(case, mode, dt, dev)
        for n, ref in oracles[length].items():
            worst[n] = max(worst.get(n, 0.0), rel(first[n], ref))
        spread = max(spread, *(float((first[n] - again[n]).abs().max()) for n in PADDED_GRADS))
    return {**{("d" + n if n != "out" else n): e for n, e in worst.items()}, "rerun_max_abs_diff": spread}


def padded_ttt_case(p: dict, cfg: dict, length: int, passes: int, seed: int) -> dict:
    """Pass ``passes``' queries and the keys/values of passes 0..passes over ``rows`` right-padded rows."""
    g = torch.Generator().manual_seed(seed)
    R, H, G, D = p["rows"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    dt = getattr(torch, cfg["dtype"])
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dt).double()
    return {"q": r(R, length, H, D), **{f"k{i}": r(R, length, G, D) for i in range(passes + 1)},
            **{f"v{i}": r(R, length, G, D) for i in range(passes + 1)}, "grad_out": r(R, length, H, D)}


def _ttt_leaves(case: dict) -> list[str]:
    return [n for n in case if n != "grad_out"]


def _passes(case: dict) -> int:
    """The branch passes of a padded TTT case (its keys are passes 0..P)."""
    return sum(n.startswith("k") for n in case) - 1


def padded_ttt_oracle(case: dict, device) -> dict:
    """Output and gradients row by row from the fp64 dense oracle and its TTT mask."""
    leaves = {n: case[n].to(device, copy=True).requires_grad_(True) for n in _ttt_leaves(case)}
    P, (R, L) = _passes(case), case["q"].shape[:2]
    mask = eagle3_ttt_mask(torch.tensor([0, L]), P).to(device)
    outs = [dense_attention(leaves["q"][r], torch.cat([leaves[f"k{i}"][r] for i in range(P + 1)]),
                            torch.cat([leaves[f"v{i}"][r] for i in range(P + 1)]), mask,
                            case["q"].shape[-1] ** -0.5)[0] for r in range(R)]
    out = torch.stack(outs)
    out.backward(case["grad_out"].to(device))
    return {"out": out.detach(), **{n: leaves[n].grad for n in leaves}}


def run_padded_ttt(case: dict, mode: str, dtype: torch.dtype, device) -> dict:
    """kernels.attention.padded_ttt under SDPA ``mode`` ("default", "deterministic" or "math")."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.attention.padded_ttt import padded_ttt_attention
    from repro.rl.sft import deterministic_algorithms
    leaves = {n: case[n].to(device, dtype, copy=True).requires_grad_(True) for n in _ttt_leaves(case)}
    P = _passes(case)
    ctx = sdpa_kernel([SDPBackend.MATH]) if mode == "math" else contextlib.nullcontext()
    with deterministic_algorithms(mode == "deterministic"), ctx:
        out = padded_ttt_attention(leaves["q"], [leaves[f"k{i}"] for i in range(P + 1)],
                                   [leaves[f"v{i}"] for i in range(P + 1)])
        out.backward(case["grad_out"].to(device, dtype))
    return {"out": out.detach(), **{n: leaves[n].grad for n in leaves}}


def check_padded_ttt(p: dict, cfg: dict, mode: str) -> dict:
    dev, dt = torch.device(cfg["device"]), getattr(torch, cfg["dtype"])
    worst = {}
    for i, (length, passes) in enumerate(itertools.product(p["lengths"], (1, 2))):
        case = padded_ttt_case(p, cfg, length, passes, seed=100 + i)
        ref, got = padded_ttt_oracle(case, dev), run_padded_ttt(case, mode, dt, dev)
        for n, x in ref.items():
            key = f"ttt{passes + 1}." + (n if n == "out" else "d" + n)
            worst[key] = max(worst.get(key, 0.0), rel(got[n], x))
    return worst


def check_ring(world: int, cases: dict, backend_of: dict[str, str]) -> dict:
    """Every case through the ring at ``world`` ranks, case ``name`` on backend ``backend_of[name]``."""
    import dataclasses

    from kernels.launch import spawn
    cs = [dataclasses.replace(c, backend=backend_of[name]) for name, c in cases.items()]
    res = spawn(run_cases, world, args=(cs,), timeout_s=900)
    errs = {}
    for name, i in zip(cases, range(len(cs))):
        for r in res:
            for k, v in _from_abs(r[i]).items():
                errs[f"{name}.{k}"] = max(errs.get(f"{name}.{k}", 0.0), v)
    return errs


# -- driver -----------------------------------------------------------------------------------------------

def routes(name: str, spec: MaskSpec, device, dtype) -> list[str]:
    """The block-path routes for backend ``name``: itself where it runs prefix masks, else prefix_full[name]."""
    b = backends.get(name)
    own = name if b.supports(spec, device, dtype) else prefix_full(name)
    extra = [prefix_full("flash4"), "fused"] if name == "flash4" else []
    return [r for r in [own, *extra] if r == "fused" or r in backends.NAMES]


def ring_routes(name: str, cases: dict[str, Case], prefix: MaskSpec, device, dtype) -> dict[str, str]:
    """The backend each ring case runs on: ``name``, and for a block-draft case (prefix masks) the first of its block
    routes (``name`` where it runs prefix masks, else ``prefix_full[name]``)."""
    block = routes(name, prefix, device, dtype)[0]
    return {c: block if case.family == "block" else name for c, case in cases.items()}


def available(name: str, spec: MaskSpec, device, dtype) -> str | None:
    """None when backend ``name`` runs causal masks here, else why not."""
    b = backends.get(name)
    if b.supports(spec, device, dtype):
        return None
    return b.unavailable_reason(spec, device, dtype) or f"{name} does not run {dtype} on {device.type} here"


def run_check(profile: str, cfg: dict, only: set | None = None) -> dict:
    dev, dt = torch.device(cfg["device"]), getattr(torch, cfg["dtype"])
    tol = TOL[cfg["dtype"]]
    rows = []

    def row(path: str, backend: str, case: str, fn):
        t0 = time.perf_counter()
        entry = {"path": path, "backend": backend, "case": case}
        try:
            err = fn()
            worst = max((v for k, v in err.items() if k != "rerun_max_abs_diff"), default=0.0)
            entry.update(err=err, worst=worst, status="PASS" if worst <= tol else "FAIL")
        except Exception as exc:  # noqa: BLE001 -- whatever a check raises becomes its row in the table
            entry.update(status="ERROR", error=f"{type(exc).__name__}: {exc}",
                         traceback=traceback.format_exc()[-4000:])
        entry["seconds"] = time.perf_counter() - t0
        rows.append(entry)
        shown = f"worst {entry['worst']:.2e}" if "worst" in entry else entry.get("error", "")[:160]
        print(f"[attention_check] {entry['status']:5s} {path:7s} {backend:22s} {case:14s} {shown}", flush=True)

    specs = kernel_specs(cfg["lengths"])
    names, skipped = [], {}
    for name in cfg["backends"]:
        why = available(name, specs["causal"], dev, dt)
        if why is None:
            names.append(name)
        else:
            skipped[name] = why
            status = "FAIL" if name in cfg["require"] else "SKIP"
            rows.append({"path": "backend", "backend": name, "case": "available", "status": status, "error": why})
            print(f"[attention_check] {status:5s} backend {name:22s} {why}", flush=True)
    cases = front_cases(cfg)
    refs = {}
    for cname, case in cases.items():
        cu, t = case_inputs(case)
        refs[cname] = case_reference(case, cu, t)
    want = (lambda path: only is None or path in only)
    for name in names:
        b = backends.get(name)
        for kind, spec in specs.items():
            bk = b if b.supports(spec, dev, dt) else backends.get(prefix_full(name))
            if want("kernel"):
                row("kernel", bk.name, kind, lambda bk=bk, spec=spec: check_kernel(bk, spec, cfg))
            if want("kernel") and name == "flash4" and kind in ("causal", "prefix"):   # backward split per K/V head
                row("kernel", "flash4[head groups]", kind,
                    lambda spec=spec: check_kernel(type(b)(bwd_workspace_bytes=1), spec, cfg))
        for cname in ("trunk", "ttt2", "ttt3"):
            if want(cname):
                row(cname, name, "lengths",
                    lambda cname=cname, name=name: check_front(name, cases[cname], refs[cname]))
        if want("block"):
            for route in routes(name, specs["prefix"], dev, dt):
                fn = ((lambda: check_fused(cases["block"], refs["block"])) if route == "fused"
                      else (lambda route=route: check_front(route, cases["block"], refs["block"])))
                row("block", route, "anchors", fn)
    if want("padded"):
        p = cfg["padded"]
        oracles: dict = {}
        modes = list(p["modes"]) + (["flash4"] if "flash4" in names else [])
        for mode in modes:
            row("padded", "flash4" if mode == "flash4" else f"sdpa:{mode}", f"{len(p['lengths'])} lengths",
                lambda mode=mode: check_padded(p, cfg, mode, oracles))
    if want("padded_ttt"):
        p = cfg["padded"]
        for mode in p["modes"]:
            row("padded_ttt", f"sdpa:{mode}", f"{len(p['lengths'])} lengths",
                lambda mode=mode: check_padded_ttt(p, cfg, mode))
    if want("ring"):
        ring_backend = "flash4" if "flash4" in names else (names[0] if names else "torch")
        backend_of = ring_routes(ring_backend, cases, specs["prefix"], dev, dt)
        n_dev = torch.cuda.device_count() if dev.type == "cuda" else 2
        for world in cfg["ring_world"]:
            if world > n_dev:
                rows.append({"path": "ring", "backend": ring_backend, "case": f"C={world}", "status": "SKIP",
                             "error": f"needs {world} devices, found {n_dev}"})
                continue
            row("ring", ring_backend, f"C={world}", lambda world=world: check_ring(world, cases, backend_of))
    used = {n: dict(getattr(backends.get(n), "used", {})) for n in names if getattr(backends.get(n), "used", None)}
    return {"profile": profile, "device": str(dev), "dtype": cfg["dtype"], "tolerance": tol, "backends": names,
            "skipped": skipped, "used": used, "rows": rows,
            "verdict": "FAIL" if any(r["status"] in ("FAIL", "ERROR") for r in rows) else "PASS"}


def table(result: dict) -> str:
    head = (f"attention check on {result['device']} ({result['dtype']}, tolerance {result['tolerance']:g} of the "
            "oracle's largest value)")
    lines = [head, f"{'status':6s} {'path':7s} {'backend':22s} {'case':14s} worst"]
    for r in result["rows"]:
        worst = f"{r['worst']:.2e}" if "worst" in r else r.get("error", "")[:90]
        lines.append(f"{r['status']:6s} {r['path']:7s} {r['backend']:22s} {r['case']:14s} {worst}")
    lines.append(f"verdict: {result['verdict']}" + ("" if result["verdict"] == "PASS" else
                                                     " (see the FAIL/ERROR rows; tracebacks in the JSON)"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True, help="profile name, or a path to a profile .yaml file")
    ap.add_argument("--out", type=Path, required=True, help="folder for attention_check.json")
    ap.add_argument("--paths", default=None, help="comma list of paths to run (default all): kernel,trunk,ttt2,"
                                                  "ttt3,block,padded,padded_ttt,ring")
    ap.add_argument("--backends", default=None, help="comma list overriding the profile's backends")
    ap.add_argument("--ring-world", default=None, help="comma list overriding the profile's process-group sizes")
    args = ap.parse_args(argv)
    cfg = bench_settings(args.profile, "attention_check")
    if args.backends:
        cfg["backends"] = [b for b in args.backends.split(",") if b]
    if args.ring_world:
        try:
            cfg["ring_world"] = [int(w) for w in args.ring_world.split(",") if w]
        except ValueError:
            ap.error(f"--ring-world {args.ring_world!r} is invalid: expected a comma list of integers >= 1")
        if min(cfg["ring_world"], default=1) < 1:
            ap.error(f"--ring-world {args.ring_world!r} is invalid: expected integers >= 1")
    bad = [b for b in cfg["backends"] if b not in backends.NAMES]
    if bad:
        ap.error(f"--backends {bad} are unknown: expected names from {backends.NAMES}")
    only = None if args.paths is None else {p for p in args.paths.split(",") if p}
    known = {"kernel", "trunk", "ttt2", "ttt3", "block", "padded", "padded_ttt", "ring"}
    if only is not None and not only <= known:
        ap.error(f"--paths {sorted(only - known)} are unknown: expected some of {sorted(known)}")
    if cfg["device"] == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"profile {args.profile} checks CUDA backends but this machine has no GPU")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")            # deterministic mode needs it for cuBLAS
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")   # flash-attn-4: compile once per machine
    t0 = time.perf_counter()
    result = run_check(args.profile, cfg, only)
    result["wall_s"] = time.perf_counter() - t0
    result["provenance"] = provenance({"script": "repro.bench.attention_check", "profile": args.profile, **cfg})
    write_json_atomic(args.out / "attention_check.json", result)
    print(table(result), flush=True)
    return 0 if result["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
