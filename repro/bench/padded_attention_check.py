"""The block drafts' padded attention (one masked SDPA call, ``kernels.attention.padded``) against the fp64 oracle
on this machine's device: values and gradients, per SDPA mode, over key lengths of every residue mod 32.

Why: on a GPU the drafts' offline training took SDPA's memory-efficient backward, which is not deterministic, and
warm starts trained with torch's deterministic kernels ended at lower losses (results/1xh200/h200/determinism).
This asks whether either backward is *wrong* for this mask, not just differently rounded. Per case it records,
for the output and the gradients of q, k, v and the context keys/values, max |x - oracle| / max |oracle|, where the
oracle is ``kernels.attention.reference.dense_attention`` with ``reference.block_mask`` in fp64; and how far
two backward passes of the same inputs differ (0 when the mode is deterministic). Modes:

* ``default``: whatever SDPA picks (a boolean mask on a GPU: the memory-efficient kernel);
* ``deterministic``: the same under ``torch.use_deterministic_algorithms(True)``, as ``rl.sft.deterministic``;
* ``math``: SDPA's math backend forced (``torch.nn.attention.sdpa_kernel``).

    python -m repro.bench.padded_attention_check --out results/.../padded_check.json            # GPU when present
    python -m repro.bench.padded_attention_check --out /tmp/c.json --rows 2 --heads 4 --kv-heads 2 --head-dim 16 \
        --lengths 5,6 --dtypes float32                                                          # a quick CPU run
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels.attention.padded import padded_block_attention
from kernels.attention.reference import block_mask, dense_attention
from repro.core.io import write_json_atomic
from repro.core.provenance import provenance
from repro.rl.sft import deterministic_algorithms

MODES = ("default", "deterministic", "math")
GRADS = ("q", "k", "v", "ctx_k", "ctx_v")


def make_case(rows: int, blocks: int, block: int, heads: int, kv_heads: int, head_dim: int, length: int,
              seed: int) -> dict[str, torch.Tensor]:
    """fp64 CPU inputs: random q/k/v, a context of ``length`` keys, anchors (token positions) in [0, length), the last
    block invalid."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, blocks * block, heads, head_dim, generator=g, dtype=torch.float64)
    k, v = (torch.randn(rows, blocks * block, kv_heads, head_dim, generator=g, dtype=torch.float64) for _ in "kv")
    ctx_k, ctx_v = (torch.randn(rows, length, kv_heads, head_dim, generator=g, dtype=torch.float64) for _ in "kv")
    anchors = torch.randint(0, length, (rows, blocks), generator=g)
    valid = torch.ones(rows, blocks, dtype=torch.bool)
    valid[:, -1] = False
    grad_out = torch.randn(rows, blocks * block, heads, head_dim, generator=g, dtype=torch.float64)
    return {"q": q, "k": k, "v": v, "ctx_k": ctx_k, "ctx_v": ctx_v, "anchors": anchors, "valid": valid,
            "grad_out": grad_out}


def oracle(case: dict[str, torch.Tensor], block: int) -> dict[str, torch.Tensor]:
    """Output and gradients row by row from the fp64 dense oracle and its own block mask."""
    leaves = {n: case[n].clone().requires_grad_(True) for n in GRADS}
    scale, length = case["q"].shape[-1] ** -0.5, case["ctx_k"].shape[1]
    outs = []
    for r in range(case["q"].shape[0]):
        mask = block_mask(torch.tensor([0, length]), case["anchors"][r], block, block_valid=case["valid"][r])
        keys = torch.cat([leaves["ctx_k"][r], leaves["k"][r]])
        vals = torch.cat([leaves["ctx_v"][r], leaves["v"][r]])
        outs.append(dense_attention(leaves["q"][r], keys, vals, mask, scale)[0])
    out = torch.stack(outs)
    out.backward(case["grad_out"])
    return {"out": out.detach(), **{n: leaves[n].grad for n in GRADS}}


def run_mode(case: dict[str, torch.Tensor], mode: str, dtype: torch.dtype, device: str) -> dict[str, torch.Tensor]:
    leaves = {n: case[n].to(device, dtype).requires_grad_(True) for n in GRADS}
    anchors, valid = case["anchors"].to(device), case["valid"].to(device)
    backend = sdpa_kernel([SDPBackend.MATH]) if mode == "math" else contextlib.nullcontext()
    with deterministic_algorithms(mode == "deterministic"), backend:
        out = padded_block_attention(leaves["q"], leaves["k"], leaves["v"], leaves["ctx_k"], leaves["ctx_v"],
                                     anchors, valid)
        out.backward(case["grad_out"].to(device, dtype))
    return {"out": out.detach(), **{n: leaves[n].grad for n in GRADS}}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double().cpu() - ref).abs().max() / ref.abs().max().clamp_min(1e-300))


def check(args) -> dict:
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    cases = []
    for n, length in enumerate(args.lengths):
        case = make_case(args.rows, args.blocks, args.block, args.heads, args.kv_heads, args.head_dim, length, n)
        ref = oracle(case, args.block)
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            for mode in args.modes:
                first, again = run_mode(case, mode, dtype, device), run_mode(case, mode, dtype, device)
                errs = {k: rel_err(first[k], ref[k]) for k in first}
                spread = {k: float((first[k] - again[k]).abs().max()) for k in GRADS}
                cases.append({"kv_length": length + args.blocks * args.block, "context_length": length,
                              "dtype": dtype_name, "mode": mode, "rel_err": errs, "rerun_max_abs_diff": spread})
                print(f"[padded_check] S={length} {dtype_name} {mode}: max rel err "
                      f"{max(errs.values()):.2e}, rerun diff {max(spread.values()):.2e}", flush=True)
    worst = {}
    for c in cases:
        key = f"{c['dtype']}/{c['mode']}"
        worst[key] = max(worst.get(key, 0.0), *c["rel_err"].values())
    return {"device": device, "worst_rel_err": worst, "cases": cases}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write (atomically)")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=6, help="blocks per row (the last is invalid)")
    ap.add_argument("--block", type=int, default=8, help="slots per block (the drafts' block_size)")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--lengths", type=_ints, default=list(range(40, 72)),
                    help="context lengths, comma-separated (default 40..71: every key length mod 32)")
    ap.add_argument("--dtypes", type=lambda s: s.split(","), default=["float32", "bfloat16"])
    ap.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    ap.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is present")
    args = ap.parse_args(argv)
    for name in ("rows", "blocks", "block", "heads", "kv_heads", "head_dim"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)} is invalid: expected an integer >= 1")
    if args.heads % args.kv_heads:
        ap.error(f"--heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")
    if not args.lengths or min(args.lengths) < 1:
        ap.error(f"--lengths {args.lengths} is invalid: expected context lengths >= 1")
    bad = [m for m in args.modes if m not in MODES] + [d for d in args.dtypes
                                                       if not isinstance(getattr(torch, d, None), torch.dtype)]
    if bad:
        ap.error(f"{bad} are invalid: expected modes from {MODES} and torch dtype names (float32, bfloat16)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # deterministic mode requires it for cuBLAS
    t0 = time.perf_counter()
    result = check(args)
    config = {k: v for k, v in vars(args).items() if k != "out"}
    write_json_atomic(args.out, {**result, "wall_s": time.perf_counter() - t0,
                                 "provenance": provenance({"script": "repro.bench.padded_attention_check", **config})})
    for key, err in sorted(result["worst_rel_err"].items()):
        print(f"{key}: worst relative error {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
