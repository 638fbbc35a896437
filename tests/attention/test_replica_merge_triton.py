"""The Triton replica fold of prefix_full (kernels/attention/replica_merge_triton.py) under Triton's CPU interpreter.

Without a GPU, tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported, so the kernels run on CPU
tensors. Checked: PrefixAsFull with the fold on the kernels against the same backend on the torch ops and against
the fp64 dense reference (values and gradients), with empty segments, rows that see no key, non-power-of-two
heads and head dims and strided lse; and that a kernel that fails hands over to the torch ops.

Run: .venv/bin/python -m pytest -q tests/attention/test_replica_merge_triton.py
"""
import os

import pytest
import torch

pytest.importorskip("triton")

from kernels.attention import backends, triton_ops  # noqa: E402
from kernels.attention.backends.prefix_full import PrefixAsFull  # noqa: E402
from kernels.attention.reference import dense_attention  # noqa: E402
from kernels.attention.spec import MaskSpec  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module", autouse=True)
def interpreted():
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("these checks run the kernels on CPU tensors under Triton's interpreter")


def _case(seed=0, H=6, G=3, D=12):
    g = torch.Generator().manual_seed(seed)
    cu_q = torch.tensor([0, 9, 9, 25, 40])           # an empty query segment
    cu_k = torch.tensor([0, 7, 12, 12, 37])          # an empty key segment
    seg = torch.repeat_interleave(torch.arange(4), cu_q.diff())
    lo, hi = cu_k[seg], cu_k[seg + 1]
    ke = lo + (torch.rand(int(cu_q[-1]), generator=g) * (hi - lo + 1).double()).long()   # some rows see nothing
    spec = MaskSpec.prefix(cu_q, cu_k, ke)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    return spec, r(spec.num_q, H, D), r(spec.num_k, G, D), r(spec.num_k, G, D), r(spec.num_q, H, D)


@pytest.mark.parametrize("H,G,D", [(6, 3, 12), (4, 4, 16)])
def test_fold_on_the_kernels_matches_torch_and_fp64(H, G, D):
    spec, q, k, v, do = _case(H=H, G=G, D=D)
    scale = 0.4
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ro, rl = dense_attention(qr, kr, vr, spec.dense(), scale)
    rg = torch.autograd.grad(ro, [qr, kr, vr], do)
    f = lambda x: x.float()
    tri = PrefixAsFull(backends.get("torch"), merge="triton")
    tor = PrefixAsFull(backends.get("torch"), merge="torch")
    out, lse = tri.forward(f(q), f(k), f(v), spec, scale)
    o2, l2 = tor.forward(f(q), f(k), f(v), spec, scale)
    empty = torch.isneginf(rl)
    assert torch.equal(torch.isneginf(lse), empty) and (out[empty.all(1)] == 0).all()
    assert (out.double() - ro).abs().max() < 1e-5 and (lse[~empty].double() - rl[~empty]).abs().max() < 1e-5
    assert (out - o2).abs().max() < 1e-5
    got = tri.backward(f(do), f(q), f(k), f(v), out, lse, spec, scale)
    ref = tor.backward(f(do), f(q), f(k), f(v), out, lse, spec, scale)
    for a, b, r in zip(got, ref, rg):
        assert (a.double() - r).abs().max() < 1e-4 and (a - b).abs().max() < 1e-5


def test_strided_lse_and_bf16_outputs():
    """The kernels take the inner backend's lse as any [N, H] view and write out in the output's dtype."""
    from kernels.attention import replica_merge_triton as K
    g = torch.Generator().manual_seed(2)
    N, T, H, D = 11, 4, 3, 8
    o_r = torch.randn(N, H, D, generator=g)
    l_r = torch.randn(H, N, generator=g).t()                 # strides (1, N)
    l_r[3] = float("-inf")
    pos = torch.randperm(N, generator=g)
    ptr = torch.tensor([0, 4, 4, 9, 11])                     # row 1 has no replica
    out, lse = K.merge_replicas(o_r, l_r, ptr, pos, torch.empty(T, H, D, dtype=torch.bfloat16), torch.empty(T, H))
    for t in range(T):
        rep = pos[ptr[t]:ptr[t + 1]]
        if rep.numel() == 0:
            assert (out[t] == 0).all() and torch.isneginf(lse[t]).all()
            continue
        ref_l = torch.logsumexp(l_r[rep], 0)
        ref_o = (torch.exp(l_r[rep] - ref_l)[..., None] * o_r[rep]).sum(0)
        assert (lse[t] - ref_l).abs().max() < 1e-5 and (out[t].float() - ref_o).abs().max() < 2e-2
    dq = K.sum_replicas(o_r.to(torch.bfloat16), ptr, pos, torch.empty(T, H, D))
    assert torch.equal(dq[1], torch.zeros(H, D))
    assert (dq[3] - o_r[pos[9:11]].to(torch.bfloat16).float().sum(0)).abs().max() < 1e-5


def test_a_kernel_that_fails_hands_over_to_the_torch_ops(monkeypatch):
    """Under "auto" a failing kernel warns once and gives None (the caller's torch ops run), and is not tried
    again; under "triton" the failure is raised."""
    class Broken:
        def merge_replicas(self, *a):
            raise RuntimeError("no such intrinsic")
    monkeypatch.setitem(triton_ops._MODS, PrefixAsFull.KERNELS, Broken())
    spec, q, k, v, _ = _case(seed=4)
    with pytest.raises(RuntimeError, match="no such intrinsic"):
        PrefixAsFull(backends.get("torch"), merge="triton").forward(q.float(), k.float(), v.float(), spec, 0.5)
    with pytest.warns(RuntimeWarning, match="no such intrinsic"):
        assert triton_ops.attempt(PrefixAsFull.KERNELS, Broken(), "auto", "test", "merge_replicas") is None
    name = PrefixAsFull.KERNELS
    assert triton_ops.load(name) is None and "no such intrinsic" in triton_ops.error(name)
    with pytest.raises(ValueError, match="merge"):
        PrefixAsFull(backends.get("torch"), merge="cuda")
