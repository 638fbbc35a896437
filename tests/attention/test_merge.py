"""LSE merge: exactness against logsumexp over the union, associativity, commutativity, -inf rows.

Run: .venv/bin/python -m pytest -q tests/attention/test_merge.py
"""
import pytest
import torch

from kernels.attention.merge import merge, merge_

pytestmark = pytest.mark.timeout(60)
NEG = float("-inf")


def _partial(s: torch.Tensor, v: torch.Tensor):
    """(out, lse) of scores s [T, n] over values v [T, n, D]; an all -inf row gives (0, -inf)."""
    lse = torch.logsumexp(s, -1)
    p = torch.where(torch.isneginf(s), torch.zeros_like(s), torch.exp(s - lse.nan_to_num(0, 0, 0).unsqueeze(-1)))
    return torch.einsum("tn,tnd->td", p, v).unsqueeze(1), lse.unsqueeze(1)


def _case(seed=0, T=6, n=5, D=3):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(T, n, generator=g, dtype=torch.float64) * 3
    v = torch.randn(T, n, D, generator=g, dtype=torch.float64)
    return s, v


def test_merge_equals_union():
    s, v = _case()
    full = _partial(s, v)
    got = merge(*_partial(s[:, :2], v[:, :2]), *_partial(s[:, 2:], v[:, 2:]))
    assert torch.allclose(got[0], full[0], atol=1e-14) and torch.allclose(got[1], full[1], atol=1e-14)


def test_merge_commutative_and_associative():
    s, v = _case(1)
    a, b, c = _partial(s[:, :1], v[:, :1]), _partial(s[:, 1:3], v[:, 1:3]), _partial(s[:, 3:], v[:, 3:])
    ab_c = merge(*merge(*a, *b), *c)
    a_bc = merge(*a, *merge(*b, *c))
    ba = merge(*b, *a)
    ab = merge(*a, *b)
    for x, y in ((ab_c, a_bc), (ab, ba)):
        assert torch.allclose(x[0], y[0], atol=1e-14) and torch.allclose(x[1], y[1], atol=1e-14)


def test_merge_neg_inf_both_sides_is_nan_free():
    out = torch.randn(4, 2, 3, dtype=torch.float64)
    lse = torch.full((4, 2), NEG, dtype=torch.float64)
    o, l = merge(out, lse, out * 2, lse.clone())
    assert not torch.isnan(o).any() and torch.equal(o, torch.zeros_like(o))
    assert torch.isneginf(l).all()


def test_merge_neg_inf_one_side_is_identity():
    s, v = _case(2)
    a = _partial(s, v)
    empty = (torch.zeros_like(a[0]), torch.full_like(a[1], NEG))
    for x in (merge(*a, *empty), merge(*empty, *a)):
        assert torch.equal(x[1], a[1]) and torch.allclose(x[0], a[0], atol=1e-15)


def test_merge_inplace_rows_matches_functional():
    s, v = _case(3)
    a, b = _partial(s[:, :2], v[:, :2]), _partial(s[:, 2:], v[:, 2:])
    acc_o, acc_l = a[0].clone(), a[1].clone()
    rows = torch.tensor([1, 4])
    merge_(acc_o, acc_l, b[0][rows], b[1][rows], rows)
    ref = merge(*a, *b)
    assert torch.allclose(acc_o[rows], ref[0][rows], atol=1e-14)
    keep = torch.tensor([0, 2, 3, 5])
    assert torch.equal(acc_o[keep], a[0][keep])


def test_merge_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="matching shapes"):
        merge(torch.zeros(2, 1, 3), torch.zeros(2, 1), torch.zeros(3, 1, 3), torch.zeros(3, 1))


def _large(dtype_out, dtype_lse, seed, T=64, H=4, D=16, centre=100.0):
    """Two partials with lse near ``centre`` (exp overflows fp32/bf16 past ~88.7), some rows empty on one side."""
    g = torch.Generator().manual_seed(seed)
    la = centre + torch.randn(T, H, generator=g, dtype=torch.float64) * 4
    lb = centre + torch.randn(T, H, generator=g, dtype=torch.float64) * 4
    la[:5] = NEG                                            # rows whose first part saw no key
    lb[-3:] = NEG
    oa = torch.randn(T, H, D, generator=g, dtype=torch.float64)
    ob = torch.randn(T, H, D, generator=g, dtype=torch.float64)
    return oa.to(dtype_out), la.to(dtype_lse), ob.to(dtype_out), lb.to(dtype_lse)


def _fp64_merge(oa, la, ob, lb):
    """The oracle: Eq. 2 evaluated in fp64 on exactly the given (rounded) partials."""
    oa, la, ob, lb = (x.double() for x in (oa, la, ob, lb))
    lse = torch.logaddexp(la, lb)
    return torch.exp(la - lse)[..., None] * oa + torch.exp(lb - lse)[..., None] * ob, lse


@pytest.mark.parametrize("dtype_out,dtype_lse,tol", [(torch.float32, torch.float32, 1e-6),
                                                     (torch.bfloat16, torch.float32, 1e-2),
                                                     (torch.bfloat16, torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("centre", [100.0, -100.0])
def test_merge_of_large_logits_is_pinned_to_fp64(dtype_out, dtype_lse, tol, centre):
    """lse near +-100 (fp32: the ring's accumulators; bf16: the kernels' outputs, and bf16 lse): without the
    max subtraction exp(lse) overflows (inf / inf = NaN) or underflows (0 / 0), so this pins the stable form."""
    oa, la, ob, lb = _large(dtype_out, dtype_lse, seed=int(centre) + 7, centre=centre)
    ref_o, ref_l = _fp64_merge(oa, la, ob, lb)
    out, lse = merge(oa, la, ob, lb)
    assert torch.isfinite(out).all() and out.dtype == dtype_out
    assert (out.double() - ref_o).abs().max() <= tol * ref_o.abs().max()
    assert (lse.double() - ref_l).abs().max() <= 1e-5 * ref_l.abs().max()
    acc_o, acc_l = oa.float().clone(), la.float().clone()             # the ring's in-place fp32 accumulation
    rows = torch.arange(0, oa.shape[0], 2)
    merge_(acc_o, acc_l, ob[rows], lb[rows], rows)
    ref_o2, ref_l2 = _fp64_merge(oa[rows], la[rows], ob[rows], lb[rows])
    assert torch.isfinite(acc_o).all()
    assert (acc_o[rows].double() - ref_o2).abs().max() <= tol * ref_o2.abs().max()
    assert (acc_l[rows].double() - ref_l2).abs().max() <= 1e-5 * ref_l2.abs().max()
    merge_(acc_o, acc_l, ob, lb)                                       # every row
    assert torch.isfinite(acc_o).all()


def test_merge_of_partials_from_large_scores_matches_the_whole():
    """Partials of real scores near 100 (fp32, as the ring holds them) merge to the fp64 attention over all keys
    (to the rounding of an fp32 lse near 100: ulp 7.6e-6)."""
    g = torch.Generator().manual_seed(9)
    s = 100 + torch.randn(6, 40, generator=g, dtype=torch.float64) * 3
    v = torch.randn(6, 40, 5, generator=g, dtype=torch.float64)
    full = _partial(s, v)
    a, b = _partial(s[:, :13], v[:, :13]), _partial(s[:, 13:], v[:, 13:])
    out, lse = merge(a[0].float(), a[1].float(), b[0].float(), b[1].float())
    assert (out.double() - full[0]).abs().max() < 2e-5 and (lse.double() - full[1]).abs().max() < 2e-5
