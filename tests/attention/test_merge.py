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
