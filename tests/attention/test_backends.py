"""Backend parity in fp64 (torch vs sdpa_cpu vs dense reference) for every mask kind, and the
split-keys / joint-LSE backward identity that the ring relies on.

Run: .venv/bin/python -m pytest -q tests/attention/test_backends.py
"""
import pytest
import torch

from kernels.attention import backends
from kernels.attention.merge import merge
from kernels.attention.reference import dense_attention
from kernels.attention.selfcheck import split_keys_backward
from kernels.attention.spec import MaskSpec

pytestmark = pytest.mark.timeout(120)


def _specs():
    g = torch.Generator().manual_seed(0)
    cu_q = torch.tensor([0, 7, 7, 19, 30])          # includes an empty query segment
    cu_k = torch.tensor([0, 5, 9, 9, 24])           # and an empty key segment
    cu = torch.tensor([0, 1, 9, 25, 40])
    seg = torch.repeat_interleave(torch.arange(4), cu_q.diff())
    lo, hi = cu_k[seg], cu_k[seg + 1]
    ke = lo + (torch.rand(int(cu_q[-1]), generator=g) * (hi - lo + 1).double()).long()   # some rows empty
    return {"causal": MaskSpec.causal(cu), "full": MaskSpec.full(cu_q, cu_k),
            "prefix": MaskSpec.prefix(cu_q, cu_k, ke)}


def _qkv(spec, H=4, G=2, D=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    return r(spec.num_q, H, D), r(spec.num_k, G, D), r(spec.num_k, G, D), r(spec.num_q, H, D)


CASES = [(kind, name) for kind in ("causal", "full", "prefix") for name in ("torch", "sdpa_cpu")]
CASES += [("prefix", "prefix_full[torch]"), ("prefix", "prefix_full[sdpa_cpu]")]


@pytest.mark.parametrize("kind,name", CASES)
def test_backend_matches_dense_reference(kind, name):
    spec = _specs()[kind]
    q, k, v, do = _qkv(spec)
    scale = 0.3
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ro, rl = dense_attention(qr, kr, vr, spec.dense(), scale)
    rg = torch.autograd.grad(ro, [qr, kr, vr], do)
    b = backends.get(name)
    out, lse = b.forward(q, k, v, spec, scale)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(rl)), "rows without keys must have lse = -inf"
    assert (out[torch.isneginf(rl).all(1)] == 0).all()
    fin = ~torch.isneginf(rl)
    assert (out - ro).abs().max() < 1e-12 and (lse[fin] - rl[fin]).abs().max() < 1e-12
    got = b.backward(do, q, k, v, out, lse, spec, scale)
    for a, r in zip(got, rg):
        assert (a - r).abs().max() < 1e-12


@pytest.mark.parametrize("name", ["torch", "sdpa_cpu"])
def test_split_keys_joint_lse_backward(name):
    """Backward of each key half with the *joint* (out, lse) sums to the gradient of the whole."""
    cu = torch.tensor([0, 12, 30])
    whole = MaskSpec.full(cu, cu)
    q, k, v, do = _qkv(whole, seed=3)
    b = backends.get(name)
    halves = [torch.cat([torch.arange(0, 6), torch.arange(12, 21)]),
              torch.cat([torch.arange(6, 12), torch.arange(21, 30)])]
    cu_h = torch.tensor([0, 6, 15])
    parts = []
    for idx in halves:
        spec = MaskSpec.full(cu, cu_h)
        parts.append((idx, spec, b.forward(q, k[idx], v[idx], spec, 0.5)))
    out, lse = merge(*parts[0][2], *parts[1][2])
    ref_out, ref_lse = b.forward(q, k, v, whole, 0.5)
    assert (out - ref_out).abs().max() < 1e-13 and (lse - ref_lse).abs().max() < 1e-13
    dq, dk, dv = split_keys_backward(b, do, q, k, v, out, lse, [(idx, spec) for idx, spec, _ in parts], 0.5)
    rq, rk, rv = b.backward(do, q, k, v, ref_out, ref_lse, whole, 0.5)
    for a, r in ((dq, rq), (dk, rk), (dv, rv)):
        assert (a - r).abs().max() < 1e-13


def test_select_auto_and_errors():
    spec = _specs()["prefix"]
    assert backends.select("auto", spec, torch.device("cpu"), torch.float64).name == "sdpa_cpu"
    assert backends.select("auto", spec, torch.device("cpu"), torch.bfloat16).name == "torch"
    with pytest.raises(ValueError, match="unknown attention backend"):
        backends.select("nope", spec, torch.device("cpu"), torch.float64)
    with pytest.raises(ValueError, match="cannot run"):
        backends.select("sdpa_cuda", spec, torch.device("cpu"), torch.float64)


def test_maskspec_validation():
    with pytest.raises(ValueError, match="equal query and key segment lengths"):
        MaskSpec("causal", torch.tensor([0, 3]), torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="non-decreasing"):
        MaskSpec.causal(torch.tensor([0, 5, 3]))
    with pytest.raises(ValueError, match="must be 0"):
        MaskSpec.causal(torch.tensor([1, 5]))
    with pytest.raises(ValueError, match="key_end"):
        MaskSpec("prefix", torch.tensor([0, 2]), torch.tensor([0, 2]))


def test_pairs_counts_visible_entries():
    for spec in _specs().values():
        assert spec.pairs() == int(spec.dense().sum())


def test_prefix_full_replicas_cover_each_visible_pair_once():
    from kernels.attention.backends.prefix_full import _expand
    spec = _specs()["prefix"]
    idx, full = _expand(spec)
    got = torch.zeros(spec.num_q, spec.num_k, dtype=torch.int64)
    m = full.dense()
    for r in range(idx.numel()):
        got[idx[r]] += m[r].long()
    assert torch.equal(got, spec.dense().long())
    assert full.num_k == spec.num_k and full.pairs() == spec.pairs()
