"""The Triton TTT-branch kernels (kernels/attention/ttt_branch_triton.py) under Triton's CPU interpreter.

Without a GPU, tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported, so the kernels run on CPU
tensors. Checked: the merge and the backward against the torch
path of TTTBranch and, through eagle3_ttt_attention, the whole pass against the fp64 dense reference (values
and gradients), with ragged row counts, non-power-of-two heads per group and head dims, strided inputs, and
bf16. The same kernels on a GPU are checked by repro.bench.attention_check.

Run: .venv/bin/python -m pytest -q tests/attention/test_ttt_branch_triton.py
"""
import os

import pytest
import torch

pytest.importorskip("triton")

from kernels.attention import branch as branch_mod  # noqa: E402
from kernels.attention import eagle3_ttt_attention, triton_ops  # noqa: E402
from kernels.attention.branch import TTTBranch  # noqa: E402
from kernels.attention.reference import dense_attention, eagle3_ttt_mask  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def interpreted():
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("these checks run the kernels on CPU tensors under Triton's interpreter")
    from kernels.attention import ttt_branch_triton
    return ttt_branch_triton


def _inputs(T, H, G, D, P, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)
    q, o_t, dout = r(T, H, D), r(T, H, D), r(T, H, D)
    l_t = torch.randn(T, H, generator=g) * 3
    l_t[::7] = float("-inf")                               # rows whose trunk saw nothing
    ks, vs = [r(T, G, D) for _ in range(P)], [r(T, G, D) for _ in range(P)]
    return q, o_t, l_t, ks, vs, dout


@pytest.mark.parametrize("T,H,G,D,P", [(37, 4, 2, 16, 1), (70, 6, 2, 24, 3), (5, 8, 8, 32, 2)])
def test_kernels_match_the_torch_path(interpreted, T, H, G, D, P):
    q, o_t, l_t, ks, vs, dout = _inputs(T, H, G, D, P, torch.float32)
    ref = TTTBranch(P, impl="torch")
    ro, rl = ref.merge_forward(q, o_t.clone(), l_t.clone(), *ks, *vs, scale=0.3)
    out, lse = torch.empty_like(q), torch.empty(T, H)
    interpreted.merge_forward(q, o_t, l_t, ks, vs, out, lse, 0.3)
    assert (out - ro).abs().max() < 1e-5 and (lse - rl).abs().max() < 1e-5
    dq_ref = torch.randn(T, H, D)
    dq = dq_ref.clone()
    rg = ref.backward(dout, q, ro, rl, *ks, *vs, scale=0.3, dq=dq_ref)
    dks, dvs = interpreted.backward(dout, q, ro, rl, ks, vs, dq, 0.3)
    assert (dq - dq_ref).abs().max() < 1e-5
    for a, b in zip((*dks, *dvs), rg):
        assert (a - b).abs().max() < 1e-5


def test_merge_writes_in_place_and_reads_strided_inputs(interpreted):
    """out may be the trunk's buffer; q and the keys may be views with a row stride of their own."""
    T, H, G, D, P = 33, 4, 2, 16, 2
    q, o_t, l_t, ks, vs, _ = _inputs(T, H, G, D, P, torch.float32, seed=1)
    wide = torch.randn(T, H + 2, D)
    wide[:, 1:H + 1] = q
    qs = wide[:, 1:H + 1]                                     # row stride (H+2) D
    ro, rl = TTTBranch(P, impl="torch").merge_forward(q, o_t.clone(), l_t.clone(), *ks, *vs, scale=0.5)
    buf = o_t.clone()
    wide_k = torch.randn(T, G + 1, D)
    wide_k[:, :G] = ks[0]
    mixed = [wide_k[:, :G], *ks[1:]]                          # one strided key tensor among contiguous ones
    interpreted.merge_forward(qs, buf, l_t, mixed, vs, buf, l_t.clone(), 0.5)
    assert (buf - ro).abs().max() < 1e-5


def test_bf16_merge_and_backward_round_once(interpreted):
    T, H, G, D, P = 40, 4, 1, 32, 2
    q, o_t, l_t, ks, vs, dout = _inputs(T, H, G, D, P, torch.bfloat16, seed=2)
    d = lambda x: x.double()
    ro, rl = TTTBranch(P, impl="torch").merge_forward(d(q), d(o_t), d(l_t), *map(d, ks), *map(d, vs), scale=0.2)
    out, lse = torch.empty_like(q), torch.empty(T, H)
    interpreted.merge_forward(q, o_t, l_t, ks, vs, out, lse, 0.2)
    assert (out.double() - ro).abs().max() < 2e-2 and (lse.double() - rl).abs().max() < 1e-4


@pytest.mark.parametrize("passes", [2, 3])
def test_ttt_attention_on_the_kernels_matches_fp64(interpreted, monkeypatch, passes):
    """eagle3_ttt_attention with the branch on the kernels (fp32) against the fp64 dense reference."""
    monkeypatch.setattr(branch_mod, "triton_kernels", lambda: interpreted)
    monkeypatch.setattr(TTTBranch, "__init__", _force_triton(TTTBranch.__init__))
    cu = torch.tensor([0, 9, 30, 31, 58])
    T, H, G, D = 58, 6, 3, 16
    g = torch.Generator().manual_seed(3)
    leaf = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()
    q, ks, vs = leaf(T, H, D), [leaf(T, G, D) for _ in range(passes)], [leaf(T, G, D) for _ in range(passes)]
    dout = torch.randn(T, H, D, generator=g, dtype=torch.float64)
    f = lambda x: x.float().detach().requires_grad_()
    qf, kf, vf = f(q), [f(k) for k in ks], [f(v) for v in vs]
    out = eagle3_ttt_attention(qf, kf, vf, cu, backend="torch")
    out.backward(dout.float())
    ro, _ = dense_attention(q, torch.cat(ks), torch.cat(vs), eagle3_ttt_mask(cu, passes - 1), D ** -0.5)
    ro.backward(dout)
    assert (out.double() - ro).abs().max() < 1e-5
    for a, b in zip((qf, *kf, *vf), (q, *ks, *vs)):
        assert (a.grad.double() - b.grad).abs().max() < 1e-4


def _force_triton(init):
    def wrapped(self, num_keys, chunk_elems=None, impl="auto"):
        init(self, num_keys, chunk_elems, impl="triton")
    return wrapped


def test_impl_is_checked_and_auto_keeps_cpu_on_torch():
    with pytest.raises(ValueError, match="impl"):
        TTTBranch(1, impl="cuda")
    assert TTTBranch(1)._kernels(torch.zeros(1, 1, 1)) is None


def test_a_kernel_that_fails_leaves_the_torch_ops_in_charge(monkeypatch):
    """Under "auto", kernels that do not build here warn once and the torch ops give the result; "triton" raises."""
    class Broken:
        def merge_forward(self, *a):
            raise RuntimeError("no such intrinsic")
    monkeypatch.setitem(triton_ops._MODS, branch_mod.KERNELS, Broken())
    T, H, G, D, P = 9, 4, 2, 8, 1
    q, o_t, l_t, ks, vs, _ = _inputs(T, H, G, D, P, torch.float32, seed=5)
    b = TTTBranch(P)
    monkeypatch.setattr(b, "_kernels", lambda q: branch_mod.triton_kernels())
    with pytest.warns(RuntimeWarning, match="no such intrinsic"):
        out, lse = b.merge_forward(q, o_t.clone(), l_t.clone(), *ks, *vs, scale=0.5)
    ref = TTTBranch(P, impl="torch").merge_forward(q, o_t.clone(), l_t.clone(), *ks, *vs, scale=0.5)
    assert torch.equal(out, ref[0]) and branch_mod.triton_kernels() is None
    monkeypatch.setitem(triton_ops._MODS, branch_mod.KERNELS, Broken())
    with pytest.raises(RuntimeError, match="no such intrinsic"):
        TTTBranch(P, impl="triton").merge_forward(q, o_t.clone(), l_t.clone(), *ks, *vs, scale=0.5)
