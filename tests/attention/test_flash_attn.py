"""The external flash-attn adapter ("flash_attn", kernels/attention/backends/flash_attn.py).

flash-attn is not installed on this machine nor on the lent GPU, so these tests do NOT run the real
kernels. Each test injects a fake module into sys.modules -- ``flash_attn`` (FA2: current layout
with softmax_lse [H, total_q] and ``window_size_left/right``, and the older one with a padded
[B, H, max_seqlen_q] LSE and a ``window_size`` tuple) or ``flash_attn_interface`` (FA3 names:
``is_causal``, ``sequed_q``) -- whose functions implement flash-attn's documented semantics on top of
fp64 dense math: packed [total, heads, D] inputs with int32 cu_seqlens on the data's device and
exact max_seqlen, causal aligned to the bottom-right corner, query head h on K/V head h // (H/G),
out = 0 and an LSE of +inf on rows without keys, and a backward that writes dq/dk/dv in place
from the out/softmax_lse it is given. What is checked is therefore the adapter: its cu_seqlens,
layout and LSE conversions, its causal flag, the joint-LSE backward and the argument mapping per
version, against the fp64 reference; plus the probe and the error when the package is missing.

Run: .venv/bin/python -m pytest -q tests/attention/test_flash_attn.py
"""
import itertools
import sys
import types

import pytest
import torch

from kernels.attention import backends
from kernels.attention.backends import flash_attn as fa_mod
from kernels.attention.backends.flash_attn import FlashAttnBackend
from kernels.attention.backends.prefix_full import PrefixAsFull
from kernels.attention.merge import merge
from kernels.attention.reference import dense_attention
from kernels.attention.selfcheck import Case, run_case, split_keys_backward
from kernels.attention.spec import MaskSpec

pytestmark = pytest.mark.timeout(120)
CALLS: list = []


def _check_cu(cu, x, name):
    assert cu.dtype == torch.int32, f"{name} must be int32, got {cu.dtype}"
    assert cu.device == x.device, f"{name} must live on the data's device"


def _segments(cu_q, cu_k, max_q, max_k):
    cq, ck = cu_q.tolist(), cu_k.tolist()
    lq = [b - a for a, b in itertools.pairwise(cq)]
    lk = [b - a for a, b in itertools.pairwise(ck)]
    assert max_q == max(lq) and max_k == max(lk), f"max_seqlen ({max_q}, {max_k}) != ({max(lq)}, {max(lk)})"
    return list(zip(cq, cq[1:], ck, ck[1:]))


def _scores(q, k, q0, q1, k0, k1, causal, scale):
    H, G = q.shape[1], k.shape[1]
    kk = k[k0:k1].double().repeat_interleave(H // G, dim=1)            # head h -> K/V head h // (H/G)
    s = torch.einsum("qhd,khd->hqk", q[q0:q1].double(), kk) * scale
    if causal:                                                            # bottom-right aligned
        i = torch.arange(q1 - q0)[:, None]
        j = torch.arange(k1 - k0)[None, :]
        s = s.masked_fill(j > i + (k1 - k0) - (q1 - q0), float("-inf"))
    return s


def _fake_forward(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, layout):
    _check_cu(cu_q, q, "cu_seqlens_q")
    _check_cu(cu_k, q, "cu_seqlens_k")
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    T, H, D = q.shape
    out = torch.zeros(T, H, D, dtype=torch.float64)
    lse_rows = torch.full((T, H), float("inf"), dtype=torch.float64)       # rows without keys: +inf
    for q0, q1, k0, k1 in _segments(cu_q, cu_k, max_q, max_k):
        if q1 == q0 or k1 == k0:
            continue
        s = _scores(q, k, q0, q1, k0, k1, causal, softmax_scale)
        m = torch.logsumexp(s, -1)
        ok = torch.isfinite(m)
        p = torch.where(ok[..., None], torch.exp(s - torch.where(ok, m, 0)[..., None]), 0)
        vv = v[k0:k1].double().repeat_interleave(H // k.shape[1], dim=1)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", p, vv)
        lse_rows[q0:q1] = torch.where(ok, m, float("inf")).transpose(0, 1)
    if layout == "packed":
        lse = lse_rows.transpose(0, 1).float().contiguous()
    else:                                                                 # older FA2: [B, H, max_q] padded
        B = cu_q.numel() - 1
        lse = torch.full((B, H, max_q + 3), float("inf"))
        for b, (q0, q1, _, _) in enumerate(_segments(cu_q, cu_k, max_q, max_k)):
            lse[b, :, :q1 - q0] = lse_rows[q0:q1].transpose(0, 1).float()
    return out.to(q.dtype), lse


def _fake_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_q, cu_k, max_q, max_k, scale, causal):
    _check_cu(cu_q, q, "cu_seqlens_q")
    T, H, D = q.shape
    G = k.shape[1]
    segs = _segments(cu_q, cu_k, max_q, max_k)
    if softmax_lse.dim() == 2:
        lse = softmax_lse.transpose(0, 1).double()
    else:
        lse = torch.cat([softmax_lse[b, :, :q1 - q0].transpose(0, 1) for b, (q0, q1, _, _) in enumerate(segs)]).double()
    gq = torch.zeros(T, H, D, dtype=torch.float64)
    gk = torch.zeros(k.shape, dtype=torch.float64)
    gv = torch.zeros(v.shape, dtype=torch.float64)
    for q0, q1, k0, k1 in segs:
        if q1 == q0 or k1 == k0:
            continue
        s = _scores(q, k, q0, q1, k0, k1, causal, scale)
        p = torch.exp(s - lse[q0:q1].transpose(0, 1)[..., None])          # +inf lse -> 0
        do = dout[q0:q1].double()
        vv = v[k0:k1].double().repeat_interleave(H // G, dim=1)
        kk = k[k0:k1].double().repeat_interleave(H // G, dim=1)
        delta = (do * out[q0:q1].double()).sum(-1).transpose(0, 1)        # D_i = rowsum(dO * O)
        ds = p * (torch.einsum("qhd,khd->hqk", do, vv) - delta[..., None])
        gq[q0:q1] = torch.einsum("hqk,khd->qhd", ds, kk) * scale
        gk[k0:k1] = (torch.einsum("hqk,qhd->khd", ds, q[q0:q1].double()) * scale).view(k1 - k0, G, H // G, D).sum(2)
        gv[k0:k1] = torch.einsum("hqk,qhd->khd", p, do).view(k1 - k0, G, H // G, D).sum(2)
    dq.copy_(gq)
    dk.copy_(gk)
    dv.copy_(gv)
    return (dout.double() * out.double()).sum(-1).transpose(0, 1).float()


def _fake_fa2(layout="packed", old_signature=False):
    pkg = types.ModuleType("flash_attn")
    iface = types.ModuleType("flash_attn.flash_attn_interface")

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                               alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
        assert dropout_p == 0.0 and window_size == (-1, -1)
        CALLS.append(("fwd2", causal))
        out, lse = _fake_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 softmax_scale, causal, layout)
        return (out, lse, torch.empty(0)) if return_attn_probs else out

    if old_signature:
        def _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                                        max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                        alibi_slopes, deterministic, rng_state=None):
            assert window_size == (-1, -1) and dropout_p == 0.0
            CALLS.append(("bwd2-old", causal))
            return _fake_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                                  max_seqlen_q, max_seqlen_k, softmax_scale, causal)
    else:
        def _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                                        max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                                        window_size_left, window_size_right, softcap, alibi_slopes, deterministic,
                                        rng_state=None, zero_tensors=False):
            assert (window_size_left, window_size_right, softcap, dropout_p) == (-1, -1, 0.0, 0.0)
            CALLS.append(("bwd2", causal))
            return _fake_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                                  max_seqlen_q, max_seqlen_k, softmax_scale, causal)

    pkg.flash_attn_varlen_func = flash_attn_varlen_func
    iface.flash_attn_varlen_func = flash_attn_varlen_func
    iface._flash_attn_varlen_backward = _flash_attn_varlen_backward
    pkg.flash_attn_interface = iface
    return {"flash_attn": pkg, "flash_attn.flash_attn_interface": iface, "flash_attn_interface": None}


def _fake_fa3():
    mod = types.ModuleType("flash_attn_interface")

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                               seqused_k=None, softmax_scale=None, causal=False, qv=None, window_size=(-1, -1),
                               softcap=0.0, deterministic=False, return_attn_probs=False):
        CALLS.append(("fwd3", causal))
        out, lse = _fake_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                 causal, "packed")
        return (out, lse) if return_attn_probs else out

    def _flash_attn_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q=None, cu_seqlens_k=None, sequed_q=None,
                             sequed_k=None, max_seqlen_q=None, max_seqlen_k=None, dq=None, dk=None, dv=None,
                             softmax_scale=None, is_causal=False, window_size_left=-1, window_size_right=-1,
                             softcap=0.0, deterministic=False, sm_margin=0):
        CALLS.append(("bwd3", is_causal))
        return _fake_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, softmax_scale, is_causal)

    mod.flash_attn_varlen_func = flash_attn_varlen_func
    mod._flash_attn_backward = _flash_attn_backward
    return {"flash_attn_interface": mod, "flash_attn": None, "flash_attn.flash_attn_interface": None}


FAKES = {"fa2": lambda: _fake_fa2(), "fa2_old": lambda: _fake_fa2("padded", old_signature=True), "fa3": _fake_fa3}


@pytest.fixture(params=list(FAKES))
def fake(request, monkeypatch):
    for name, mod in FAKES[request.param]().items():
        monkeypatch.setitem(sys.modules, name, mod)          # None makes `import name` fail
    fa_mod.reset_probe()
    CALLS.clear()
    yield request.param
    fa_mod.reset_probe()


def _specs():
    g = torch.Generator().manual_seed(7)
    cu = torch.tensor([0, 1, 9, 25, 40, 40, 71])
    cu_k = torch.tensor([0, 5, 9, 9, 24, 30, 33])             # a sequence without keys
    return {"causal": MaskSpec.causal(cu), "full": MaskSpec.full(cu, cu_k)}, g


def _qkv(spec, H=4, G=2, D=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    return r(spec.num_q, H, D), r(spec.num_k, G, D), r(spec.num_k, G, D), r(spec.num_q, H, D)


@pytest.mark.parametrize("kind", ["causal", "full"])
def test_adapter_matches_dense_reference(fake, kind):
    spec = _specs()[0][kind]
    q, k, v, do = _qkv(spec)
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ro, rl = dense_attention(qr, kr, vr, spec.dense(), 0.3)
    rg = torch.autograd.grad(ro, [qr, kr, vr], do)
    b = FlashAttnBackend()
    assert fa_mod.version() == ("3" if fake == "fa3" else "2")
    out, lse = b.forward(q, k, v, spec, 0.3)
    empty = torch.isneginf(rl)
    assert torch.equal(torch.isneginf(lse), empty) and (kind == "causal") != bool(empty.any())
    assert not torch.isposinf(lse).any() and (out[empty.all(1)] == 0).all()
    assert (out - ro).abs().max() < 1e-12 and (lse[~empty] - rl[~empty]).abs().max() < 1e-6   # fp32 LSE
    got = b.backward(do, q, k, v, out, lse, spec, 0.3)
    for a, r in zip(got, rg):
        assert (a - r).abs().max() < 1e-6                     # the LSE travels in fp32, as in flash-attn
    assert [c[1] for c in CALLS] == [kind == "causal"] * 2


def test_backward_uses_the_joint_lse(fake):
    """Two key halves, merged: each half's backward with the joint (out, lse) sums to the whole."""
    cu = torch.tensor([0, 12, 30])
    whole = MaskSpec.full(cu, cu)
    q, k, v, do = _qkv(whole, seed=3)
    halves = [torch.cat([torch.arange(0, 6), torch.arange(12, 21)]),
              torch.cat([torch.arange(6, 12), torch.arange(21, 30)])]
    b = FlashAttnBackend()
    parts = [(idx, MaskSpec.full(cu, torch.tensor([0, 6, 15]))) for idx in halves]
    out, lse = merge(*b.forward(q, k[halves[0]], v[halves[0]], parts[0][1], 0.5),
                     *b.forward(q, k[halves[1]], v[halves[1]], parts[1][1], 0.5))
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ro, _ = dense_attention(qr, kr, vr, whole.dense(), 0.5)
    rg = torch.autograd.grad(ro, [qr, kr, vr], do)
    dq, dk, dv = split_keys_backward(b, do, q, k, v, out, lse, parts, 0.5)
    for a, r in zip((dq, dk, dv), rg):
        assert (a - r).abs().max() < 1e-6


@pytest.mark.parametrize("family", ["ttt", "block"])
def test_front_ends_through_the_adapter(fake, family):
    inner = FlashAttnBackend()
    b = inner if family == "ttt" else PrefixAsFull(inner)
    res = run_case(0, 1, Case(family, lengths=(5, 37, 1, 22, 3), backend=b, passes=3, slot_drop=0.3))
    assert all(v <= 1e-6 for v in res["err"].values()), res["err"]


def test_missing_package_is_probed_and_named(monkeypatch):
    for name in ("flash_attn", "flash_attn.flash_attn_interface", "flash_attn_interface"):
        monkeypatch.setitem(sys.modules, name, None)
    fa_mod.reset_probe()
    try:
        assert not fa_mod.available() and fa_mod.version() is None
        spec = _specs()[0]["causal"]
        for name in ("flash_attn", "prefix_full[flash_attn]"):
            with pytest.raises(ValueError, match="flash-attn is not installed"):
                backends.select(name, spec, torch.device("cuda"), torch.bfloat16)
        with pytest.raises(RuntimeError, match="'flash_attn' was requested but flash-attn is not installed"):
            FlashAttnBackend().forward(*_qkv(spec)[:3], spec, 0.3)
        assert backends.select("auto", spec, torch.device("cpu"), torch.float64).name == "sdpa_cpu"
    finally:
        fa_mod.reset_probe()


def test_supports_needs_cuda_half_precision_and_a_flash_kind(fake):
    spec = _specs()[0]["causal"]
    b = FlashAttnBackend()
    assert not b.supports(spec, torch.device("cpu"), torch.bfloat16)
    assert "fp16/bf16 CUDA" in b.unavailable_reason(spec, torch.device("cuda"), torch.float32)
    pre = MaskSpec.prefix(torch.tensor([0, 2]), torch.tensor([0, 3]), torch.tensor([1, 2]))
    assert "prefix_full[flash_attn]" in b.unavailable_reason(pre, torch.device("cuda"), torch.bfloat16)
    assert b.unavailable_reason(spec, torch.device("cuda"), torch.bfloat16) is None
