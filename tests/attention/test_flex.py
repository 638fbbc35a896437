"""flex_attention backend ("flex", kernels/attention/backends/flex.py) against the fp64 dense reference.

On this CPU torch 2.13 runs flex eagerly (its compiled CPU path is inference-only and returns no
LSE), in fp64 and fp32 (and bf16: forward and backward of the unfused operator), so values and
gradients are checked at the fp64 tolerance (1e-12) as well as fp32 (2e-5) and bf16 (2e-2 relative).
Both backward routes are checked: "hop" (flex's backward operator fed the joint out/lse) and
"recompute" (the block's forward re-run with autograd, cotangents rescaled to the joint softmax).
On CPU the operator ignores the block-sparsity tables (it evaluates the mask everywhere), so the
BlockMask built from the intervals is checked on its own: interpreting its partial/full block lists
the way the GPU kernel does must give exactly the spec's dense mask. The ring case runs at C = 2
through kernels.launch.spawn (gloo).

Run: .venv/bin/python -m pytest -q tests/attention/test_flex.py
"""
import warnings

import pytest
import torch

from kernels.attention import backends
from kernels.attention.backends import flex as flex_mod
from kernels.attention.backends.flex import FlexBackend, block_mask
from kernels.attention.merge import merge
from kernels.attention.reference import dense_attention
from kernels.attention.selfcheck import Case, run_case, run_cases, split_keys_backward
from kernels.attention.spec import MaskSpec
from kernels.launch import spawn

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")]
LENGTHS = (5, 37, 1, 22, 3, 60)


def _random_specs(seed=0, docs=7, max_len=70):
    g = torch.Generator().manual_seed(seed)
    lq = torch.randint(0, max_len, (docs,), generator=g)
    lk = torch.randint(0, max_len, (docs,), generator=g)
    lq[1], lk[2] = 0, 0                                          # a segment without rows, one without keys
    cu_q = torch.cat([torch.zeros(1, dtype=torch.int64), lq.cumsum(0)])
    cu_k = torch.cat([torch.zeros(1, dtype=torch.int64), lk.cumsum(0)])
    seg = torch.repeat_interleave(torch.arange(docs), lq)
    lo, hi = cu_k[seg], cu_k[seg + 1]
    ke = lo + (torch.rand(int(cu_q[-1]), generator=g) * (hi - lo + 1).double()).long()   # some rows see nothing
    return {"causal": MaskSpec.causal(cu_q), "full": MaskSpec.full(cu_q, cu_k),
            "prefix": MaskSpec.prefix(cu_q, cu_k, ke)}


def _qkv(spec, dtype, H=4, G=2, D=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    return r(spec.num_q, H, D), r(spec.num_k, G, D), r(spec.num_k, G, D), r(spec.num_q, H, D)


def _reference(spec, q, k, v, do, scale):
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ro, rl = dense_attention(qr, kr, vr, spec.dense(), scale)
    return ro.detach(), rl, torch.autograd.grad(ro, [qr, kr, vr], do)


TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("kind", ["causal", "full", "prefix"])
@pytest.mark.parametrize("bwd", ["hop", "recompute"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_values_and_gradients_match_dense_reference(kind, bwd, dtype):
    spec = _random_specs(seed=3)[kind]
    q, k, v, do = _qkv(spec, dtype)
    scale = 0.25
    ro, rl, rg = _reference(spec, q, k, v, do, scale)
    b = FlexBackend(bwd=bwd)
    cast = lambda x: x.to(dtype)
    out, lse = b.forward(cast(q), cast(k), cast(v), spec, scale)
    assert lse.dtype == torch.promote_types(dtype, torch.float32)
    empty = torch.isneginf(rl)
    assert empty.any() == (kind != "causal")                                  # the case is exercised
    assert torch.equal(torch.isneginf(lse), empty), "rows without keys must have lse = -inf"
    assert (out[empty.all(1)] == 0).all() and torch.isfinite(out).all()
    denom = max(1.0, ro.abs().max().item()) if dtype == torch.bfloat16 else 1.0
    assert (out.double() - ro).abs().max().item() / denom <= TOL[dtype]
    assert (lse[~empty].double() - rl[~empty]).abs().max().item() / denom <= TOL[dtype]
    got = b.backward(cast(do), cast(q), cast(k), cast(v), out, lse, spec, scale)
    for name, a, r in zip(("dq", "dk", "dv"), got, rg):
        assert a.shape == r.shape and torch.isfinite(a).all()
        d = max(1.0, r.abs().max().item()) if dtype == torch.bfloat16 else 1.0
        assert (a.double() - r).abs().max().item() / d <= TOL[dtype], name
    assert b.used["bwd_mode"] == bwd


@pytest.mark.parametrize("bwd", ["hop", "recompute"])
def test_split_keys_with_joint_lse(bwd):
    """Backward of each key half with the *joint* (out, lse) sums to the whole block's gradient."""
    cu = torch.tensor([0, 12, 30, 31])
    whole = MaskSpec.full(cu, cu)
    q, k, v, do = _qkv(whole, torch.float64, seed=4)
    halves = [torch.cat([torch.arange(0, 6), torch.arange(12, 21), torch.arange(30, 31)]),
              torch.cat([torch.arange(6, 12), torch.arange(21, 30)])]
    cus = [torch.tensor([0, 6, 15, 16]), torch.tensor([0, 6, 15, 15])]    # the second half: last doc keyless
    b = FlexBackend(bwd=bwd)
    parts = [(idx, MaskSpec.full(cu, ch)) for idx, ch in zip(halves, cus)]
    res = [b.forward(q, k[idx], v[idx], s, 0.5) for idx, s in parts]
    out, lse = merge(*res[0], *res[1])
    ro, rl, rg = _reference(whole, q, k, v, do, 0.5)
    assert (out - ro).abs().max() < 1e-13 and (lse - rl).abs().max() < 1e-13
    dq, dk, dv = split_keys_backward(b, do, q, k, v, out, lse, parts, 0.5)
    for a, r in zip((dq, dk, dv), rg):
        assert (a - r).abs().max() < 1e-12


def test_fully_masked_rows_zero_out_neg_inf_lse_no_nan():
    cu_q, cu_k = torch.tensor([0, 4, 9]), torch.tensor([0, 0, 6])         # doc 0 has rows, no keys
    spec = MaskSpec.prefix(cu_q, cu_k, torch.tensor([0, 0, 0, 0, 0, 0, 3, 6, 2]))   # row 4, 5: empty prefix
    q, k, v, do = _qkv(spec, torch.float64, seed=5)
    b = FlexBackend()
    out, lse = b.forward(q, k, v, spec, 0.3)
    dead = torch.tensor([0, 1, 2, 3, 4, 5])
    assert torch.isneginf(lse[dead]).all() and (out[dead] == 0).all() and torch.isfinite(lse[6:]).all()
    gq, gk, gv = b.backward(do, q, k, v, out, lse, spec, 0.3)
    assert (gq[dead] == 0).all() and all(torch.isfinite(g).all() for g in (gq, gk, gv))
    z = MaskSpec.full(torch.tensor([0, 3]), torch.tensor([0, 0]))           # no keys at all
    o0, l0 = b.forward(q[:3], k[:0], v[:0], z, 0.3)
    assert (o0 == 0).all() and torch.isneginf(l0).all()


@pytest.mark.parametrize("block", [4, 8, 128])
@pytest.mark.parametrize("kind", ["causal", "full", "prefix"])
def test_block_mask_tables_reproduce_the_spec(kind, block):
    """What the GPU kernel computes: mask_mod inside the listed partial blocks, everything inside the
    listed full blocks, nothing elsewhere. That must be the spec's mask exactly, and full blocks
    must be fully visible (the kernel skips the mask there)."""
    for seed in range(3):
        spec = _random_specs(seed=seed)[kind]
        bm, lo, hi, empty = block_mask(spec, torch.device("cpu"), block=block)
        Tq, Tk = spec.num_q, spec.num_k
        nq, nk = -(-Tq // block), -(-Tk // block)
        dense = spec.dense()
        kj = torch.arange(nk * block)[None, :]
        lo_p = torch.cat([lo, lo.new_zeros(nq * block - Tq)])[:, None]
        hi_p = torch.cat([hi, hi.new_zeros(nq * block - Tq)])[:, None]
        mod = (kj >= lo_p) & (kj < hi_p)                                    # the mask function everywhere
        got = torch.zeros(nq * block, nk * block, dtype=torch.bool)
        seen = torch.zeros(nq, nk, dtype=torch.bool)
        for tables, is_full in (((bm.kv_num_blocks, bm.kv_indices), False),
                                ((bm.full_kv_num_blocks, bm.full_kv_indices), True)):
            num, idx = tables[0][0, 0], tables[1][0, 0]
            for r in range(nq):
                for c in idx[r, :num[r]].tolist():
                    assert not seen[r, c], "a block listed twice"
                    seen[r, c] = True
                    rs, cs = slice(r * block, (r + 1) * block), slice(c * block, (c + 1) * block)
                    if is_full:
                        assert mod[rs, cs].all() and (c + 1) * block <= Tk and (r + 1) * block <= Tq
                        got[rs, cs] = True
                    else:
                        got[rs, cs] = mod[rs, cs]
        assert torch.equal(got[:Tq, :Tk], dense)
        assert not got[Tq:].any() and not got[:, Tk:].any()
        assert torch.equal(empty, torch.nonzero(~dense.any(1)).flatten())


def test_front_ends_and_errors():
    for case in (Case("ttt", lengths=LENGTHS, passes=3, backend="flex"),
                 Case("ttt", lengths=LENGTHS, passes=2, heads=4, kv_heads=1, backend=FlexBackend(bwd="recompute")),
                 Case("block", lengths=LENGTHS, backend="flex", invalid_blocks=(1,), slot_drop=0.3),
                 Case("block", lengths=LENGTHS, backend="flex", anchors=(0, 5, 42, 43, 65, 67), slot_drop=1.0)):
        res = run_case(0, 1, case)
        assert all(v <= 1e-10 for v in res["err"].values()), res["err"]
    spec = _random_specs()["causal"]
    assert backends.select("auto", spec, torch.device("cpu"), torch.float32).name != "flex"
    assert backends.select("flex", spec, torch.device("cpu"), torch.float64).name == "flex"
    with pytest.raises(ValueError, match="cannot run"):
        backends.select("flex", spec, torch.device("cpu"), torch.int64)
    with pytest.raises(ValueError, match="bwd must be"):
        FlexBackend(bwd="fast")


def test_cpu_compile_probe_falls_back_to_eager(monkeypatch):
    spec = _random_specs(seed=6)["causal"]
    q, k, v, _ = _qkv(spec, torch.float32)
    ref, _ = FlexBackend().forward(q, k, v, spec, 0.3)
    assert FlexBackend().used == {}

    monkeypatch.setattr(flex_mod, "_cxx_available", lambda: False)             # no toolchain: never compiles
    b = FlexBackend(cpu_compile="auto")
    out, _ = b.forward(q, k, v, spec, 0.3)
    assert b.used["fwd"] == "eager" and torch.equal(out, ref)

    def broken(fn, **kw):
        def run(*a, **k):
            raise RuntimeError("no compiler here")
        return run
    monkeypatch.setattr(flex_mod, "_cxx_available", lambda: True)
    monkeypatch.setattr(flex_mod, "_compile_fn", lambda fn: broken(fn))        # toolchain that fails
    b = FlexBackend(cpu_compile="auto")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out, _ = b.forward(q, k, v, spec, 0.3)
    assert b.used["fwd"] == "eager" and torch.equal(out, ref)
    assert any("compiled fwd failed on CPU" in str(x.message) for x in w)
    out, _ = b.forward(q, k, v, spec, 0.3)                                     # remembered: no retry
    assert b._compiled[("cpu", "fwd")] is None


@pytest.mark.timeout(400)
def test_ring_c2_matches_dense_reference():
    cases = [Case("ttt", lengths=LENGTHS, passes=3, backend="flex"),
             Case("ttt", lengths=LENGTHS, passes=2, backend="flex", scheme="sequential", seed=3),
             Case("block", lengths=LENGTHS, backend="flex", invalid_blocks=(1,), slot_drop=0.3, seed=2)]
    res = spawn(run_cases, 2, args=(cases,), timeout_s=360)
    fails = {f"case{i}@rank{r['rank']}": r["err"] for per_rank in res for i, r in enumerate(per_rank)
             if not all(v <= 1e-10 for v in r["err"].values())}
    assert not fails, fails
