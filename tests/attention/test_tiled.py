"""Tiled backward (kernels/attention/backends/tiled.py) and the in-place TTT merge, against the fp64
dense reference: values and gradients for causal and full packed specs with GQA at tile sizes that
cut documents, both dk/dv accumulation modes, every visible pair covered by exactly one tile, and
EAGLE-3 TTT / DFlash front ends run through a tiled backend.

Run: .venv/bin/python -m pytest -q tests/attention/test_tiled.py
"""
import pytest
import torch

from kernels.attention import backends, eagle3_ttt_attention
from kernels.attention.backends.base import Backend
from kernels.attention.backends.tiled import TiledBackward, tiles
from kernels.attention.branch import _owned
from kernels.attention.reference import dense_attention
from kernels.attention.selfcheck import Case, run_case
from kernels.attention.spec import MaskSpec

pytestmark = pytest.mark.timeout(120)


def _specs():
    g = torch.Generator().manual_seed(11)
    lens = torch.randint(1, 40, (6,), generator=g)
    lens[2] = 0                                                   # an empty document
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    lk = torch.randint(0, 30, (6,), generator=g)
    cu_k = torch.cat([torch.zeros(1, dtype=torch.int64), lk.cumsum(0)])
    return {"causal": MaskSpec.causal(cu), "full": MaskSpec.full(cu, cu_k)}


def _qkv(spec, dtype, H=4, G=2, D=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)
    return r(spec.num_q, H, D), r(spec.num_k, G, D), r(spec.num_k, G, D), r(spec.num_q, H, D)


@pytest.mark.parametrize("kind", ["causal", "full"])
@pytest.mark.parametrize("tile,kv_tile", [(1, None), (7, None), (16, None), (1000, None), (7, 0), (7, 3), (5, 11)])
def test_tiles_cover_each_visible_pair_once(kind, tile, kv_tile):
    spec = _specs()[kind]
    got = torch.zeros(spec.num_q, spec.num_k, dtype=torch.int64)
    for a, b, row in tiles(spec, tile, kv_tile):
        for c, d, sub in row:
            assert sub.num_q == b - a and sub.num_k == d - c
            got[a:b, c:d] += sub.dense().long()
    assert torch.equal(got, spec.dense().long())


@pytest.mark.parametrize("inner", ["torch", "sdpa_cpu"])
@pytest.mark.parametrize("kind", ["causal", "full"])
@pytest.mark.parametrize("dtype,grad_acc,tol", [(torch.float64, "input", 1e-12), (torch.float32, "input", 2e-5),
                                                (torch.float32, "fp32", 2e-5)])
def test_tiled_backward_matches_dense_reference(inner, kind, dtype, grad_acc, tol):
    spec = _specs()[kind]
    q, k, v, do = _qkv(spec, dtype)
    scale = 0.35
    qr, kr, vr = (x.double().clone().requires_grad_() for x in (q, k, v))
    ro, _ = dense_attention(qr, kr, vr, spec.dense(), scale)
    rg = torch.autograd.grad(ro, [qr, kr, vr], do.double())
    b = TiledBackward(backends.get(inner), tile=9, grad_acc=grad_acc, kv_tile=0 if grad_acc == "fp32" else None)
    out, lse = b.forward(q, k, v, spec, scale)
    got = b.backward(do, q, k, v, out, lse, spec, scale)
    for name, a, r in zip(("dq", "dk", "dv"), got, rg):
        assert a.shape == r.shape
        err = (a.double() - r).abs().max().item()
        assert err <= tol, f"{name}: {err}"
    assert got[1].dtype == (dtype if grad_acc == "input" else torch.promote_types(dtype, torch.float32))


def test_small_blocks_and_prefix_go_to_the_inner_backend():
    calls = []

    class Spy(backends.Backend):
        name = "spy"

        def supports(self, spec, device, dtype):
            return True

        def backward(self, *a):
            calls.append(a[-2])
            return backends.get("torch").backward(*a)

    spec = _specs()["causal"]
    q, k, v, do = _qkv(spec, torch.float64)
    out, lse = backends.get("torch").forward(q, k, v, spec, 0.3)
    TiledBackward(Spy(), tile=spec.num_q).backward(do, q, k, v, out, lse, spec, 0.3)
    assert calls == [spec]
    calls.clear()
    TiledBackward(Spy(), tile=8).backward(do, q, k, v, out, lse, spec, 0.3)
    assert len(calls) > 3 and all(s.num_q <= 8 and s.num_k <= 8 for s in calls)


def test_bad_tile_arguments():
    with pytest.raises(ValueError, match="tile must be a positive number of rows, got 0"):
        TiledBackward(backends.get("torch"), tile=0)
    with pytest.raises(ValueError, match="grad_acc must be one of"):
        TiledBackward(backends.get("torch"), grad_acc="bf16")
    with pytest.raises(ValueError, match="kv_tile must be None"):
        TiledBackward(backends.get("torch"), kv_tile=-1)


@pytest.mark.parametrize("family,extra", [("ttt", {"passes": 3}), ("ttt", {"passes": 1}),
                                          ("block", {"invalid_blocks": (1,), "slot_drop": 0.3})])
def test_front_ends_through_a_tiled_backend(family, extra):
    case = Case(family, lengths=(5, 37, 1, 22, 3), backend=TiledBackward(backends.get("sdpa_cpu"), tile=6), **extra)
    res = run_case(0, 1, case)
    bad = {k: v for k, v in res["err"].items() if not v <= 1e-10}
    assert not bad, bad


def test_ttt_merge_overwrites_only_buffers_it_owns():
    q = torch.randn(6, 2, 4)
    assert _owned(torch.randn(6, 2, 4), q, [torch.randn(6, 1, 4)])
    assert not _owned(q, q, [])                                         # the input itself
    assert not _owned(q.view(6, 2, 4), q, [])                           # a view of it
    assert not _owned(torch.randn(6, 2, 4).double(), q, [])             # another dtype (ring accumulator)
    assert not _owned(torch.randn(2, 6, 4).transpose(0, 1), q, [])      # not contiguous
    # the front end returns a fresh output and leaves its inputs alone
    cu = torch.tensor([0, 6])
    ks = [torch.randn(6, 1, 4) for _ in range(2)]
    vs = [torch.randn(6, 1, 4) for _ in range(2)]
    snap = [t.clone() for t in (q, *ks, *vs)]
    out = eagle3_ttt_attention(q, ks, vs, cu)
    assert all(torch.equal(a, b) for a, b in zip(snap, (q, *ks, *vs)))
    assert out.untyped_storage()._cdata not in {t.untyped_storage()._cdata for t in (q, *ks, *vs)}


class AnyDevice(Backend):
    """A named backend run on a device it would refuse (the meta device): same code, no data."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name

    def supports(self, spec, device, dtype) -> bool:
        return True

    def forward(self, q, k, v, spec, scale):
        return self.inner.forward(q, k, v, spec, scale)

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        return self.inner.backward(dout, q, k, v, out, lse, spec, scale)


@pytest.mark.parametrize("name", ["cudnn", "sdpa_cuda"])
@pytest.mark.parametrize("tile", [0, 64])
def test_gpu_backends_python_paths_on_meta_tensors(name, tile):
    """The cuDNN / flash code paths (one-segment fast path, per-document loop, derived backward
    metadata, tiles) run on meta tensors: shapes and dtypes only, no values (no GPU here)."""
    from kernels.attention.backends.cudnn import CudnnBackend
    from kernels.attention.backends.sdpa_cuda import SdpaCudaBackend
    inner = {"cudnn": CudnnBackend, "sdpa_cuda": SdpaCudaBackend}[name]()
    b = AnyDevice(TiledBackward(inner, tile) if tile else inner)
    for cu in (torch.tensor([0, 300]), torch.tensor([0, 5, 200, 201, 300])):
        T = int(cu[-1])
        mk = lambda *s: torch.randn(*s, device="meta", dtype=torch.bfloat16).requires_grad_()
        q, ks, vs = mk(T, 8, 16), [mk(T, 2, 16) for _ in range(3)], [mk(T, 2, 16) for _ in range(3)]
        out, lse = eagle3_ttt_attention(q, ks, vs, cu, backend=b, return_lse=True)
        assert out.shape == (T, 8, 16) and out.dtype == torch.bfloat16 and lse.shape == (T, 8)
        g = torch.autograd.grad(out, [q, *ks, *vs], torch.ones_like(out))
        assert [tuple(x.shape) for x in g] == [(T, 8, 16)] + [(T, 2, 16)] * 6
        assert all(x.dtype == torch.bfloat16 for x in g)
