"""Distributed self-check: every rank compares its CP result with the fp64 dense reference.

Each rank builds the same global tensors from a shared seed, computes the dense reference on the
whole packed batch (values and autograd gradients with one global ``dout``), shards everything with
the layout, runs the CP front end and returns the largest absolute differences (and its RingStats)
for the caller to assert on. Used by tests/attention (gloo, CPU) and repro/bench/gpu_attention.py.

    from kernels.launch import spawn
    from kernels.attention.selfcheck import Case, run_case
    errs = spawn(run_case, 2, args=(Case("ttt", lengths=(5, 37, 22), passes=3),))

``split_keys_backward`` is the single-process counterpart for one backend: the keys split in parts,
each part's backward run with the *joint* (out, lse), the gradients summed back.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from kernels.attention.api import block_draft_attention, eagle3_ttt_attention
from kernels.attention.layout import make_layout
from kernels.attention.reference import block_mask, dense_attention, eagle3_ttt_mask
from kernels.attention.ring import RingStats


def split_keys_backward(backend, dout, q, k, v, out, lse, parts, scale: float):
    """(dq, dk, dv) of attention over all keys, from ``backend.backward`` on each key part.

    ``parts``: ``(key index, MaskSpec of q against k[index])`` pairs partitioning the keys; ``out``/``lse``
    are the joint result (the parts merged by LSE). dq sums over parts; dk/dv land at their indices.
    """
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for idx, spec in parts:
        gq, gk, gv = backend.backward(dout, q, k[idx], v[idx], out, lse, spec, scale)
        dq += gq
        dk[idx] += gk
        dv[idx] += gv
    return dq, dk, dv


@dataclass(frozen=True)
class Case:
    family: str                         # "ttt" or "block"
    lengths: tuple = (5, 37, 22)
    heads: int = 4
    kv_heads: int = 2
    dim: int = 8
    passes: int = 3                     # ttt: pass index k is passes - 1
    block: int = 4                      # block: B
    anchors: tuple = ()                 # block: global anchor tokens (default: spread + doc start/end)
    invalid_blocks: tuple = ()          # block: indices of fully invalid blocks
    slot_drop: float = 0.25             # block: fraction of invalid slots
    dtype: str = "float64"
    backend: str = "auto"
    seed: int = 0
    device: str = "cpu"
    scheme: str = "zigzag"              # "sequential": the basic ring (must agree with zigzag)
    usp: tuple = ()                     # (U, R): run the USP baseline instead (family "ttt" only)
    usp_ring: str = "sequential"        # USP's ring: "sequential" (SpecForge) or "zigzag" (USP-zigzag)
    ref_device: str = "cpu"             # where the fp64 reference runs (a GPU is much faster at real head counts)


def _tensors(case: Case, cu: torch.Tensor):
    """The case's inputs in fp64, each value representable in the case's dtype (so the reference sees exactly
    what the kernels get)."""
    t = _raw_tensors(case, cu)
    dt = getattr(torch, case.dtype)
    rnd = lambda x: x.to(dt).double() if x.is_floating_point() else x
    return {n: [rnd(a) for a in x] if isinstance(x, list) else rnd(x) for n, x in t.items()}


def _raw_tensors(case: Case, cu: torch.Tensor):
    g = torch.Generator().manual_seed(case.seed)
    T, H, G, D = int(cu[-1]), case.heads, case.kv_heads, case.dim
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    if case.family == "ttt":
        K = case.passes
        return {"q": r(T, H, D), "ks": [r(T, G, D) for _ in range(K)], "vs": [r(T, G, D) for _ in range(K)],
                "dout": r(T, H, D)}
    anchors = torch.tensor(case.anchors, dtype=torch.int64) if case.anchors else _default_anchors(cu)
    Nb, B = anchors.numel(), case.block
    sv = torch.rand(Nb, B, generator=g) >= case.slot_drop
    bv = torch.ones(Nb, dtype=torch.bool)
    for i in case.invalid_blocks:
        bv[i] = False
    return {"q": r(Nb, B, H, D), "bk": r(Nb, B, G, D), "bv": r(Nb, B, G, D), "ck": r(T, G, D),
            "cv": r(T, G, D), "anchors": anchors, "slot_valid": sv, "block_valid": bv,
            "dout": r(Nb, B, H, D)}


def _default_anchors(cu: torch.Tensor) -> torch.Tensor:
    a = []
    for d in range(cu.numel() - 1):
        s, e = int(cu[d]), int(cu[d + 1])
        if e > s:
            a += sorted({s, (s + e) // 2, e - 1})
    return torch.tensor(a, dtype=torch.int64)


def reference(case: Case, cu: torch.Tensor, t: dict):
    """Global fp64 reference: (out, lse, grads dict)."""
    scale = case.dim ** -0.5
    if case.family == "ttt":
        q = t["q"].clone().requires_grad_()
        ks = [k.clone().requires_grad_() for k in t["ks"]]
        vs = [v.clone().requires_grad_() for v in t["vs"]]
        mask = eagle3_ttt_mask(cu, case.passes - 1).to(q.device)
        out, lse = dense_attention(q, torch.cat(ks), torch.cat(vs), mask, scale)
        g = torch.autograd.grad(out, [q, *ks, *vs], t["dout"])
        K = case.passes
        return out.detach(), lse, {"q": g[0], "ks": list(g[1:1 + K]), "vs": list(g[1 + K:])}
    Nb, B, H, D = t["q"].shape
    G = case.kv_heads
    leaves = {n: t[n].clone().requires_grad_() for n in ("q", "bk", "bv", "ck", "cv")}
    m = block_mask(cu, t["anchors"], B, t["slot_valid"], t["block_valid"]).to(t["q"].device)
    out, lse = dense_attention(leaves["q"].reshape(-1, H, D),
                               torch.cat([leaves["ck"], leaves["bk"].reshape(-1, G, D)]),
                               torch.cat([leaves["cv"], leaves["bv"].reshape(-1, G, D)]), m, scale)
    out = out.view(Nb, B, H, D)
    g = torch.autograd.grad(out, list(leaves.values()), t["dout"])
    return out.detach(), lse.view(Nb, B, H), dict(zip(leaves, g))


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if a.shape != b.shape:
        raise AssertionError(f"shape {tuple(a.shape)} vs {tuple(b.shape)}")
    inf_a, inf_b = torch.isinf(a), torch.isinf(b)
    if not torch.equal(inf_a, inf_b) or not torch.equal(a[inf_a], b[inf_b]):
        return float("inf")
    d = (a[~inf_a] - b[~inf_b]).abs()
    return float(d.max()) if d.numel() else 0.0


def _scale_of(ref_out, ref_g) -> dict:
    m = lambda x: float(x.detach().abs().max()) if x.numel() else 0.0
    flat = lambda v: v if isinstance(v, list) else [v]
    return {"out": m(ref_out), **{f"d{k}": max(m(t) for t in flat(v)) for k, v in ref_g.items()}}


def case_inputs(case: Case):
    """(cu_seqlens, fp64 input tensors on the CPU) of ``case``."""
    cu = torch.tensor([0, *torch.tensor(case.lengths).cumsum(0).tolist()], dtype=torch.int64)
    return cu, _tensors(case, cu)


def case_reference(case: Case, cu: torch.Tensor, t: dict):
    """``reference`` computed on ``case.ref_device``."""
    dev = torch.device(case.ref_device)
    mv = lambda x: x.to(dev) if isinstance(x, torch.Tensor) else [a.to(dev) for a in x]
    return reference(case, cu, {n: mv(x) for n, x in t.items()})


def run_case(rank: int, world: int, case: Case, ref=None) -> dict:
    """Worker: returns {"err": {name: max abs diff}, "stats": RingStats dict, "num_local": ...,
    "ref_max": max |reference| per output/gradient} (divide for relative errors). ``ref``: the case's
    reference from ``case_reference``, when the caller has it already."""
    group = dist.group.WORLD if dist.is_initialized() else None
    cu, t = case_inputs(case)
    ref_out, ref_lse, ref_g = ref if ref is not None else case_reference(case, cu, t)
    if case.usp:
        return _run_usp(rank, case, cu, t, ref_out, ref_g)
    ref_max = _scale_of(ref_out, ref_g)
    lay = make_layout(cu, group, scheme=case.scheme)
    dt = getattr(torch, case.dtype)
    dev = torch.device(case.device)
    mv = lambda x: x.to(dev, dt).requires_grad_()
    stats = RingStats()
    err = {}
    if case.family == "ttt":
        q = mv(lay.shard(t["q"]))
        ks = [mv(lay.shard(k)) for k in t["ks"]]
        vs = [mv(lay.shard(v)) for v in t["vs"]]
        out, lse = eagle3_ttt_attention(q, ks, vs, lay, group, backend=case.backend, return_lse=True,
                                        stats=stats)
        g = torch.autograd.grad(out, [q, *ks, *vs], lay.shard(t["dout"]).to(dev, dt))
        real = lay.real
        err["out"] = _maxdiff(out[real], lay.shard(ref_out)[real])
        err["lse"] = _maxdiff(lse[real], lay.shard(ref_lse)[real])
        err["dq"] = _maxdiff(g[0][real], lay.shard(ref_g["q"])[real])
        K = case.passes
        err["dk"] = max(_maxdiff(a[real], lay.shard(b)[real]) for a, b in zip(g[1:1 + K], ref_g["ks"]))
        err["dv"] = max(_maxdiff(a[real], lay.shard(b)[real]) for a, b in zip(g[1 + K:], ref_g["vs"]))
    else:
        _, _, owner, _, _ = lay.locate(t["anchors"])
        mine = torch.nonzero(owner == lay.rank).flatten()
        sel = lambda x: x.index_select(0, mine.to(x.device))
        q, bk, bv = mv(sel(t["q"])), mv(sel(t["bk"])), mv(sel(t["bv"]))
        ck, cv = mv(lay.shard(t["ck"])), mv(lay.shard(t["cv"]))
        out, lse = block_draft_attention(q, bk, bv, ck, cv, sel(t["anchors"]), lay, group,
                                         slot_valid=sel(t["slot_valid"]), block_valid=sel(t["block_valid"]),
                                         backend=case.backend, return_lse=True, stats=stats)
        g = torch.autograd.grad(out, [q, bk, bv, ck, cv], sel(t["dout"]).to(dev, dt))
        err["out"] = _maxdiff(out, sel(ref_out))
        err["lse"] = _maxdiff(lse, sel(ref_lse))
        err["dq"] = _maxdiff(g[0], sel(ref_g["q"]))
        err["dk"] = max(_maxdiff(g[1], sel(ref_g["bk"])), _maxdiff(g[3][lay.real], lay.shard(ref_g["ck"])[lay.real]))
        err["dv"] = max(_maxdiff(g[2], sel(ref_g["bv"])), _maxdiff(g[4][lay.real], lay.shard(ref_g["cv"])[lay.real]))
        return {"err": err, "stats": stats.as_dict(), "num_local": lay.num_local, "rank": rank,
                "blocks_here": int(mine.numel()), "ref_max": ref_max}
    return {"err": err, "stats": stats.as_dict(), "num_local": lay.num_local, "rank": rank, "ref_max": ref_max}


def _run_usp(rank: int, case: Case, cu: torch.Tensor, t: dict, ref_out, ref_g) -> dict:
    """USP baseline for a TTT case: run passes 0..K-1, check the last pass against the reference."""
    from kernels.attention.usp import UspBatch, make_usp_groups, usp_eagle3_ttt_attention
    U, R = case.usp
    groups = make_usp_groups(U, R)
    batch = UspBatch(case.lengths, U * R, ttt_length=case.passes, ulysses=U, ring=case.usp_ring)
    g = groups.rank
    dt = getattr(torch, case.dtype)
    loc = lambda x: batch.local(batch.pad(x), g).to(case.device, dt).requires_grad_()
    K = case.passes
    gen = torch.Generator().manual_seed(case.seed + 1)
    ks, vs = [loc(k) for k in t["ks"]], [loc(v) for v in t["vs"]]
    stats = RingStats()
    cache: list = []
    out = None
    for p in range(K):
        qp = t["q"] if p == K - 1 else torch.randn(t["q"].shape, generator=gen, dtype=torch.float64)
        qp = loc(qp)
        out = usp_eagle3_ttt_attention(qp, ks[p], vs[p], cache, groups, backend=case.backend, ring=case.usp_ring,
                                       stats=stats)
    grads = torch.autograd.grad(out, [qp, *ks, *vs], loc(t["dout"]).detach())
    real = batch.local(batch.pad(torch.ones(int(cu[-1]), dtype=torch.bool)), g)
    ref = lambda x: batch.local(batch.pad(x), g)
    err = {"out": _maxdiff(out[real], ref(ref_out)[real]), "dq": _maxdiff(grads[0][real], ref(ref_g["q"])[real]),
           "dk": max(_maxdiff(a[real], ref(b)[real]) for a, b in zip(grads[1:1 + K], ref_g["ks"])),
           "dv": max(_maxdiff(a[real], ref(b)[real]) for a, b in zip(grads[1 + K:], ref_g["vs"]))}
    return {"err": err, "stats": stats.as_dict(), "rank": rank, "pad_factor": batch.pad_factor}


def run_cases(rank: int, world: int, cases: list) -> list:
    """Worker running several cases in one process group (saves process start-up in tests)."""
    return [run_case(rank, world, c) for c in cases]


def check_bad_inputs(rank: int, world: int) -> list:
    """Worker: every bad call must raise before any communication. Returns (name, error, message, comm_calls)."""
    from kernels.attention import ring as ring_mod
    from kernels.attention import usp as usp_mod
    from kernels.attention.usp import UspGroups, usp_eagle3_ttt_attention
    calls = {"n": 0}
    orig_b, orig_a = dist.batch_isend_irecv, dist.all_to_all_single

    def count_b(*a, **k):
        calls["n"] += 1
        return orig_b(*a, **k)

    def count_a(*a, **k):
        calls["n"] += 1
        return orig_a(*a, **k)

    ring_mod.dist.batch_isend_irecv = count_b
    usp_mod.dist.all_to_all_single = count_a
    group = dist.group.WORLD
    cu = torch.tensor([0, 10, 26], dtype=torch.int64)
    lay = make_layout(cu, group)
    T, H, G, D = lay.num_local, 4, 2, 8
    f = torch.float64
    q, k, v = torch.randn(T, H, D, dtype=f), torch.randn(T, G, D, dtype=f), torch.randn(T, G, D, dtype=f)
    bq, bk = torch.randn(2, 3, H, D, dtype=f), torch.randn(2, 3, G, D, dtype=f)
    mine = torch.nonzero(lay.locate(torch.arange(26))[2] == lay.rank).flatten()[:2]
    other = torch.nonzero(lay.locate(torch.arange(26))[2] != lay.rank).flatten()[:2]
    i64 = lambda x: x.to(torch.int64)
    bad = {
        "rows_vs_cu": lambda: eagle3_ttt_attention(q[:-1], [k[:-1]], [v[:-1]], lay, group),
        "cu_total_mismatch": lambda: eagle3_ttt_attention(q, [k], [v], make_layout(torch.tensor([0, 10, 30]), group),
                                                          group),
        # a total that pads to this rank's rows: the layout's shard() of the real global tensor refuses it
        "cu_total_vs_real_tokens": lambda: make_layout(torch.tensor([0, 10, 25]), group).shard(
            torch.randn(26, H, D, dtype=f)),
        "cu_bare_under_cp": lambda: eagle3_ttt_attention(q, [k], [v], cu, group),
        "cu_decreasing": lambda: eagle3_ttt_attention(q, [k], [v], torch.tensor([0, 12, 10, 26]), group),
        "heads_not_divisible": lambda: eagle3_ttt_attention(q[:, :3], [k], [v], lay, group),
        "dtype_mismatch": lambda: eagle3_ttt_attention(q, [k.float()], [v], lay, group),
        "integer_qkv": lambda: eagle3_ttt_attention(i64(q), [i64(k)], [i64(v)], lay, group),
        "integer_block_qkv": lambda: block_draft_attention(i64(bq), i64(bk), i64(bk), i64(k), i64(v), mine, lay,
                                                           group),
        "pass_count_mismatch": lambda: eagle3_ttt_attention(q, [k, k], [v], lay, group),
        "wrong_group_size": lambda: eagle3_ttt_attention(q, [k], [v], make_layout(cu, None, cp_size=world + 1,
                                                                                 rank=rank), group),
        "block_anchor_not_owned": lambda: block_draft_attention(bq, bk, bk, k, v, other, lay, group),
        "block_slot_valid_shape": lambda: block_draft_attention(bq, bk, bk, k, v, mine, lay, group,
                                                                slot_valid=torch.ones(2, 4, dtype=torch.bool)),
        "block_ctx_rows": lambda: block_draft_attention(bq, bk, bk, k[:-1], v[:-1], mine, lay, group),
        "usp_heads": lambda: usp_eagle3_ttt_attention(torch.randn(1, 4, 4, D, dtype=f),
                                                      torch.randn(1, 4, 3, D, dtype=f),
                                                      torch.randn(1, 4, 3, D, dtype=f), [],
                                                      UspGroups(2, max(1, world // 2), group, None, rank % 2,
                                                                rank // 2)),
        "usp_integer": lambda: usp_eagle3_ttt_attention(torch.ones(1, 4, 4, D, dtype=torch.int32),
                                                        torch.ones(1, 4, 2, D, dtype=torch.int32),
                                                        torch.ones(1, 4, 2, D, dtype=torch.int32), [],
                                                        UspGroups(1, world, None, group, 0, rank)),
    }
    if world == 1:
        bad.pop("block_anchor_not_owned")
        bad.pop("cu_bare_under_cp")                  # one rank: cu_seqlens is checked against the rows
    out = []
    try:
        for name, fn in bad.items():
            before = calls["n"]
            try:
                fn()
                out.append((name, None, "no error", calls["n"] - before))
            except (ValueError, TypeError) as e:
                out.append((name, type(e).__name__, str(e), calls["n"] - before))
        dist.barrier()
    finally:
        ring_mod.dist.batch_isend_irecv = orig_b
        usp_mod.dist.all_to_all_single = orig_a
    return out
