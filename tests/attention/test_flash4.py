"""The flash-attn-4 adapter ("flash4", kernels/attention/backends/flash4.py) against the fp64 dense reference.

flash-attn-4 cannot run here (no GPU) and CPU CI never imports it: these tests put a stand-in for
``flash_attn.cute`` into sys.modules (tests/attention/flash4_standin.py: the documented interface computed in
fp64 torch, mask functions by their torch twins, block-sparsity tables honoured as the kernels read them). What
is checked is the adapter: varlen arguments, the LSE layout, the empty-row rule, the masked call's aux tensors
and tile tables, the joint-LSE backward plumbing, the head-group split of the backward, the fallbacks, the
probe and ``auto``'s order. The kernels themselves are checked on the GPU (repro.bench.attention_check).

Run: .venv/bin/python -m pytest -q tests/attention/test_flash4.py
"""
import functools
import subprocess
import sys

import flash4_standin as standin
import pytest
import torch

from kernels.attention import backends
from kernels.attention.backends import flash4 as f4
from kernels.attention.backends.flash4 import Flash4Backend
from kernels.attention.merge import merge
from kernels.attention.reference import dense_attention
from kernels.attention.selfcheck import Case, run_case, split_keys_backward
from kernels.attention.spec import MaskSpec

pytestmark = pytest.mark.timeout(180)
TOL = 1e-10


@pytest.fixture
def fake(monkeypatch):
    standin.install(monkeypatch)
    f4.reset_probe()
    monkeypatch.setattr(f4, "capability", lambda device: (9, 0))
    yield standin
    f4.reset_probe()


def _specs():
    g = torch.Generator().manual_seed(3)
    cu = torch.tensor([0, 1, 9, 25, 25, 160, 171])                  # a 135-row document spans two 128-row tiles
    cu_q = torch.tensor([0, 7, 7, 19, 150, 170])                      # an empty query segment
    cu_k = torch.tensor([0, 5, 9, 9, 140, 141])                       # an empty key segment: rows see nothing
    seg = torch.repeat_interleave(torch.arange(5), cu_q.diff())
    lo, hi = cu_k[seg], cu_k[seg + 1]
    ke = lo + (torch.rand(int(cu_q[-1]), generator=g) * (hi - lo + 1).double()).long()   # some rows see nothing
    return {"causal": MaskSpec.causal(cu), "full": MaskSpec.full(cu_q, cu_k), "prefix": MaskSpec.prefix(cu_q, cu_k, ke)}


def _qkv(spec, H=4, G=2, D=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    return r(spec.num_q, H, D), r(spec.num_k, G, D), r(spec.num_k, G, D), r(spec.num_q, H, D)


def _reference(spec, q, k, v, do, scale):
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ro, rl = dense_attention(qr, kr, vr, spec.dense(), scale)
    return ro.detach(), rl, torch.autograd.grad(ro, [qr, kr, vr], do)


@pytest.mark.parametrize("kind", ["causal", "full", "prefix"])
@pytest.mark.parametrize("sparse", ["auto", "off"])
def test_adapter_matches_dense_reference(fake, kind, sparse):
    spec = _specs()[kind]
    q, k, v, do = _qkv(spec)
    ro, rl, rg = _reference(spec, q, k, v, do, 0.3)
    b = Flash4Backend(block_sparse=sparse)
    out, lse = b.forward(q, k, v, spec, 0.3)
    empty = torch.isneginf(rl)
    assert torch.equal(torch.isneginf(lse), empty) and (kind == "causal") != bool(empty.any())
    assert not torch.isnan(out).any() and (out[empty.all(1)] == 0).all()
    assert (out - ro).abs().max() < TOL and (lse[~empty] - rl[~empty]).abs().max() < 1e-6      # fp32 LSE
    got = b.backward(do, q, k, v, out, lse, spec, 0.3)
    for a, r in zip(got, rg):
        assert a.shape == r.shape and (a - r).abs().max() < 1e-6                            # fp32 LSE
    names = [c[0] for c in fake.CALLS]
    if kind == "prefix":           # one masked call each way, on the batched layout, tables on sm90 unless off
        assert names == ["func", "bwd_func"] and fake.CALLS[0][1]["mask"] == "interval"
        assert fake.CALLS[0][1]["sparse"] == fake.CALLS[1][1]["sparse"] == (sparse == "auto")
        assert b.used["prefix_fwd"] == b.used["prefix_bwd"] == ("mask+sparse" if sparse == "auto" else "mask")
    else:
        assert names == ["varlen", "bwd_varlen"] and fake.CALLS[0][1]["causal"] == (kind == "causal")


@pytest.mark.parametrize("kind,lq,lk", [("causal", 150, 150), ("causal", 7, 7), ("full", 37, 150)])
def test_one_segment_runs_the_batched_forward(fake, kind, lq, lk):
    """A single segment's forward is one flash_attn_func call, its backward the varlen one; both against the
    dense reference."""
    spec = MaskSpec.causal(torch.tensor([0, lq])) if kind == "causal" else \
        MaskSpec.full(torch.tensor([0, lq]), torch.tensor([0, lk]))
    q, k, v, do = _qkv(spec, seed=7)
    ro, rl, rg = _reference(spec, q, k, v, do, 0.3)
    b = Flash4Backend()
    out, lse = b.forward(q, k, v, spec, 0.3)
    assert (out - ro).abs().max() < TOL and (lse - rl).abs().max() < 1e-6
    for a, r in zip(b.backward(do, q, k, v, out, lse, spec, 0.3), rg):
        assert (a - r).abs().max() < 1e-6
    assert [c[0] for c in fake.CALLS] == ["func", "bwd_varlen"]
    assert fake.CALLS[0][1] == {"causal": kind == "causal"}


def test_backward_uses_the_joint_lse(fake):
    """Two key halves, merged: each half's backward with the joint (out, lse) sums to the whole."""
    cu = torch.tensor([0, 12, 30])
    whole = MaskSpec.full(cu, cu)
    q, k, v, do = _qkv(whole, seed=5)
    halves = [torch.cat([torch.arange(0, 6), torch.arange(12, 21)]),
              torch.cat([torch.arange(6, 12), torch.arange(21, 30)])]
    b = Flash4Backend()
    parts = [(idx, MaskSpec.full(cu, torch.tensor([0, 6, 15]))) for idx in halves]
    out, lse = merge(*b.forward(q, k[halves[0]], v[halves[0]], parts[0][1], 0.5),
                     *b.forward(q, k[halves[1]], v[halves[1]], parts[1][1], 0.5))
    _ro, _rl, rg = _reference(whole, q, k, v, do, 0.5)
    for a, r in zip(split_keys_backward(b, do, q, k, v, out, lse, parts, 0.5), rg):
        assert (a - r).abs().max() < 1e-6


@pytest.mark.parametrize("workspace", [1 << 30, 1])
def test_backward_head_groups_give_the_same_gradients(fake, workspace):
    """A tiny workspace limit splits the backward into one call per K/V head; gradients are unchanged."""
    for kind in ("causal", "prefix"):
        spec = _specs()[kind]
        q, k, v, do = _qkv(spec, H=6, G=3, seed=2)
        _ro, _rl, rg = _reference(spec, q, k, v, do, 0.4)
        b = Flash4Backend(bwd_workspace_bytes=workspace)
        out, lse = b.forward(q, k, v, spec, 0.4)
        fake.CALLS.clear()
        for a, r in zip(b.backward(do, q, k, v, out, lse, spec, 0.4), rg):
            assert (a - r).abs().max() < 1e-6
        heads = [c[1]["heads"] for c in fake.CALLS]
        assert heads == ([6] if workspace > 1 else [2, 2, 2]) and b.used["bwd_head_groups"] == len(heads)


def test_backward_head_groups_read_and_write_slices_in_place(fake, monkeypatch):
    """A group passes head slices of the caller's tensors (no copies) and its gradients land in slices of
    dq/dk/dv through the kernel's dq=/dk=/dv= outputs."""
    spec = _specs()["causal"]
    q, k, v, do = _qkv(spec, H=6, G=3, seed=4)
    iface, seen = sys.modules["flash_attn.cute.interface"], []
    real = iface._flash_attn_bwd

    @functools.wraps(real)
    def spy(*a, **kw):
        seen.append(kw)
        return real(*a, **kw)
    monkeypatch.setattr(iface, "_flash_attn_bwd", spy)
    f4.reset_probe()
    b = Flash4Backend(bwd_workspace_bytes=1)
    out, lse = b.forward(q, k, v, spec, 0.4)
    dq, dk, dv = b.backward(do, q, k, v, out, lse, spec, 0.4)
    assert len(seen) == 3
    for g, kw in enumerate(seen):
        assert kw["q"].data_ptr() == q[:, 2 * g].data_ptr() and kw["k"].data_ptr() == k[:, g].data_ptr()
        assert kw["dq"].data_ptr() == dq[:, 2 * g].data_ptr() and kw["dv"].data_ptr() == dv[:, g].data_ptr()
    _ro, _rl, rg = _reference(spec, q, k, v, do, 0.4)
    for a, r in zip((dq, dk, dv), rg):
        assert (a - r).abs().max() < 1e-6


def test_head_groups_bound_the_accumulators():
    b = Flash4Backend(bwd_workspace_bytes=1 << 30)
    T = 262144
    assert b.head_groups(32, 8, T, T, 128) == 8          # 6.4 GB of fp32 accumulators at 256K -> 0.8 GB each
    assert Flash4Backend().head_groups(32, 8, T, T, 128) == 4           # the default limit, 2 GiB
    assert Flash4Backend().head_groups(32, 8, 65536, 65536, 128) == 1
    assert b.head_groups(32, 8, 16384, 16384, 128) == 1
    assert b.head_groups(16, 16, T, T, 128) == 2        # MHA: no dK/dV accumulators
    with pytest.raises(ValueError, match="bwd_workspace_bytes"):
        Flash4Backend(bwd_workspace_bytes=0)


@pytest.mark.parametrize("family", ["ttt", "block"])
@pytest.mark.parametrize("passes", [1, 3])
def test_front_ends_through_the_adapter(fake, family, passes):
    """TTT (trunk + 0-2 branch passes) and block drafts (anchors at document starts: rows that see only their
    block; an invalid block: rows that see nothing) through the front ends, against the fp64 reference."""
    res = run_case(0, 1, Case(family, lengths=(5, 37, 1, 150, 3), backend=Flash4Backend(), passes=passes,
                              invalid_blocks=(2,) if family == "block" else (), slot_drop=0.3, seed=passes))
    assert all(v <= 1e-6 for v in res["err"].values()), res["err"]


def test_failed_routes_fall_back(fake):
    """Tables the kernel refuses: the mask alone (warned, remembered); a failing mask route: replicated full
    segments (warned, remembered). Results stay exact."""
    spec = _specs()["prefix"]
    q, k, v, do = _qkv(spec, seed=4)
    ro, _rl, rg = _reference(spec, q, k, v, do, 0.3)
    fake.FAIL.add("sparse")
    b = Flash4Backend()
    with pytest.warns(RuntimeWarning, match="block-sparse masked call failed"):
        out, lse = b.forward(q, k, v, spec, 0.3)
    assert (out - ro).abs().max() < TOL and b.block_sparse == "failed" and "stand-in" in b.used["sparse_error"]
    assert all(a.sub(r).abs().max() < 1e-6 for a, r in zip(b.backward(do, q, k, v, out, lse, spec, 0.3), rg))
    fake.FAIL.add("mask")
    b = Flash4Backend()
    with pytest.warns(RuntimeWarning, match="replicated full segments"):
        out, lse = b.forward(q, k, v, spec, 0.3)
    assert (out - ro).abs().max() < 1e-6 and b.used["prefix_fwd"] == "replicate"        # replicas merged: fp32 LSE
    assert all(a.sub(r).abs().max() < 1e-6 for a, r in zip(b.backward(do, q, k, v, out, lse, spec, 0.3), rg))
    strict = Flash4Backend(prefix="mask")
    with pytest.raises(RuntimeError, match="made to fail"):
        strict.forward(q, k, v, spec, 0.3)


def test_auto_picks_flash4_on_sm90_when_it_imports(fake, monkeypatch):
    spec = _specs()["causal"]
    cuda = torch.device("cuda")
    for kind in ("causal", "prefix"):
        assert backends.select("auto", _specs()[kind], cuda, torch.bfloat16).name == "flash4"
    assert backends.select("auto", spec, torch.device("cpu"), torch.float32).name == "sdpa_cpu"
    assert "fp16/bf16 CUDA" in backends.get("flash4").unavailable_reason(spec, cuda, torch.float32)
    torch.use_deterministic_algorithms(True)
    try:
        assert "deterministic" in backends.get("flash4").unavailable_reason(spec, cuda, torch.bfloat16)
        assert backends.select("auto", spec, cuda, torch.bfloat16).name != "flash4"
    finally:
        torch.use_deterministic_algorithms(False)
    monkeypatch.setattr(f4, "capability", lambda device: (8, 0))
    assert "compute capability >= 9.0" in backends.get("flash4").unavailable_reason(spec, cuda, torch.bfloat16)
    assert backends.select("auto", spec, cuda, torch.bfloat16).name != "flash4"


def test_missing_package_is_probed_and_named(monkeypatch):
    for name in ("flash_attn", "flash_attn.cute", "flash_attn.cute.interface"):
        monkeypatch.setitem(sys.modules, name, None)
    f4.reset_probe()
    try:
        assert not f4.available() and f4.version() is None
        spec = _specs()["causal"]
        for name in ("flash4", "prefix_full[flash4]", "tiled[flash4]"):
            with pytest.raises(ValueError, match="flash-attn-4 .flash_attn.cute. is not importable"):
                backends.select(name, spec, torch.device("cuda"), torch.bfloat16)
        with pytest.raises(RuntimeError, match="'flash4' was requested but flash-attn-4"):
            Flash4Backend().forward(*_qkv(spec)[:3], spec, 0.3)
    finally:
        f4.reset_probe()


def test_importing_the_suite_never_imports_flash_attn_cute():
    code = ("import sys, torch; import kernels.attention as a; from kernels.attention import backends; "
            "from kernels.attention.spec import MaskSpec; s = MaskSpec.causal(torch.tensor([0, 4])); "
            "backends.select('auto', s, torch.device('cpu'), torch.float32); "
            "print(sorted(m for m in sys.modules if m.startswith(('flash_attn', 'cutlass'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_one_call_block_route_matches_the_padded_and_packed_routes(fake):
    """The fused route (context + own block in one masked call) against the SDPA padded route and the packed
    ring route, values and every gradient in fp64: anchors at 0 (no context), an invalid block (out 0), a
    partly invalid block; one masked call forward and one backward, with tile tables on sm90."""
    from kernels.attention import block_draft_attention
    from kernels.attention.fused_block import fused_block_draft_attention
    from kernels.attention.padded import padded_block_attention
    g = torch.Generator().manual_seed(11)
    R, N, B, H, G, D, S = 2, 5, 4, 4, 2, 8, 150
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)
    q, k, v = r(R, N * B, H, D), r(R, N * B, G, D), r(R, N * B, G, D)
    ck, cv = r(R, S, G, D), r(R, S, G, D)
    anchors = torch.tensor([[0, 17, 60, 131, 149], [3, 3, 90, 140, 0]])
    valid = torch.tensor([[True, True, False, True, True], [True, True, True, True, False]])
    do = torch.randn(R, N * B, H, D, generator=g, dtype=torch.float64)
    grads = {}
    for route in ("sdpa", Flash4Backend()):
        out = padded_block_attention(q, k, v, ck, cv, anchors, valid, backend=route)
        grads[str(route)] = (out.detach(), *torch.autograd.grad(out, [q, k, v, ck, cv], do))
    ref, got = grads.values()
    for a, b in zip(got, ref):
        assert (a - b).abs().max() < 1e-6
    assert [c[0] for c in fake.CALLS] == ["func", "bwd_func"] and fake.CALLS[0][1] == {"mask": "block", "sparse": True}

    cu = torch.tensor([0, 40, 41, 200])
    anchors = torch.tensor([0, 39, 40, 41, 100, 199])
    sv = torch.rand(6, B, generator=g) > 0.3
    bv = torch.tensor([True, True, True, False, True, True])
    q, k, v = r(6, B, H, D), r(6, B, G, D), r(6, B, G, D)
    ck, cv = r(200, G, D), r(200, G, D)
    do = torch.randn(6, B, H, D, generator=g, dtype=torch.float64)
    outs = [fn(q, k, v, ck, cv, anchors, cu, slot_valid=sv, block_valid=bv, backend=be)
            for fn, be in ((fused_block_draft_attention, Flash4Backend()), (block_draft_attention, "torch"))]
    for a, b in zip(*(torch.autograd.grad(o, [q, k, v, ck, cv], do) + (o,) for o in outs)):
        assert (a - b).abs().max() < 1e-6
    assert outs[0][3].abs().max() == 0                                   # the invalid block
    with pytest.raises(TypeError, match="runs on flash-attn-4"):
        fused_block_draft_attention(q, k, v, ck, cv, anchors, cu, backend="torch")


def test_auto_takes_the_one_call_route_at_one_rank_up_to_its_length(fake, monkeypatch):
    """``block_draft_attention(backend="auto")`` with a BlockPlan at one rank on flash-attn-4 (the stand-in; the
    device check patched, as CPU tensors never pass it): one masked call each way for every layer's call, the
    problem built once per plan, values and every gradient equal to the torch route's in fp64; past the length
    rule, ``return_lse``, a named backend or no flash-attn-4 keep the trunk+branch route."""
    from types import SimpleNamespace

    from kernels.attention import api, block_draft_attention
    g = torch.Generator().manual_seed(12)
    B, H, G, D = 4, 4, 2, 8
    cu = torch.tensor([0, 40, 41, 200])
    anchors = torch.tensor([0, 39, 40, 41, 100, 199])
    sv = torch.rand(6, B, generator=g) > 0.3
    bv = torch.tensor([True, True, True, False, True, True])
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)
    q, k, v, ck, cv = r(6, B, H, D), r(6, B, G, D), r(6, B, G, D), r(200, G, D), r(200, G, D)
    do = torch.randn(6, B, H, D, generator=g, dtype=torch.float64)
    plan = api.block_draft_plan(anchors, B, cu, slot_valid=sv, block_valid=bv)
    assert api.block_route("auto", plan, q) == "auto"              # CPU tensors: never the one-call route
    monkeypatch.setattr(api, "_flash4_here", lambda q: True)
    assert api.block_route("auto", plan, q) == "one_call"
    fake.CALLS.clear()
    outs = [block_draft_attention(q, k, v, ck, cv, plan, backend=be) for be in ("auto", "auto", "torch")]
    assert [c[0] for c in fake.CALLS] == ["func", "func"] and fake.CALLS[0][1]["mask"] == "block"
    assert len(plan.one_call) == 1                                  # one problem for both calls
    grads = [torch.autograd.grad(o, [q, k, v, ck, cv], do) for o in outs[1:]]
    assert [c[0] for c in fake.CALLS][2:] == ["bwd_func"]
    for a, b in zip((outs[1], *grads[0]), (outs[2], *grads[1])):
        assert (a - b).abs().max() < 1e-6
    assert outs[1][3].abs().max() == 0                                   # the invalid block
    # the length rule, and the requests that keep the trunk+branch route
    sized = lambda n: SimpleNamespace(bounds=plan.bounds, num_blocks=6, layout=SimpleNamespace(num_local=n))
    assert [api.block_route("auto", sized(n), q) for n in (65536, 65537, 262143, 262144)] == [
        "one_call", "auto", "auto", "prefix_full[flash4]"]
    assert api.block_route("auto", plan, q, return_lse=True) == "auto"
    assert api.block_route("flash4", plan, q) == "flash4"
    assert api.block_route("auto", SimpleNamespace(bounds=None, num_blocks=6, layout=plan.layout), q) == "auto"  # CP>1
    assert api.block_route("auto", SimpleNamespace(bounds=plan.bounds, num_blocks=0, layout=plan.layout), q) == "auto"
    monkeypatch.setattr(api, "_flash4_here", lambda q: False)
    assert api.block_route("auto", plan, q) == "auto"
