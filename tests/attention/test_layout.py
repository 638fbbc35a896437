"""Zigzag/sequential sharding and the ring case table, checked by brute force against global masks.

Run: .venv/bin/python -m pytest -q tests/attention/test_layout.py
"""
import pytest
import torch

from kernels.attention import cost_model
from kernels.attention.layout import make_layout, pad_varlen
from kernels.attention.plan import causal_plan, prefix_plan

pytestmark = pytest.mark.timeout(120)
CU = torch.tensor([0, 3, 40, 41, 64, 93])     # docs shorter than 2C, lengths needing padding


def test_pad_varlen():
    cu_pad, real = pad_varlen(CU, 8)
    assert cu_pad.tolist() == [0, 8, 48, 56, 80, 112]
    assert int(real.sum()) == 93 and real[:3].all() and not real[3:8].any()


@pytest.mark.parametrize("scheme", ["zigzag", "sequential"])
@pytest.mark.parametrize("C", [1, 2, 4, 8])
def test_shard_unshard_roundtrip(scheme, C):
    x = torch.randn(int(CU[-1]), 2, 3)
    lays = [make_layout(CU, None, scheme=scheme, cp_size=C, rank=r) for r in range(C)]
    parts = [lay.shard(x) for lay in lays]
    assert len({p.shape[0] for p in parts}) == 1
    assert torch.equal(lays[0].unshard(parts, lays), x)
    rows = torch.cat([lay.global_rows() for lay in lays])
    assert sorted(rows[rows >= 0].tolist()) == list(range(int(CU[-1])))
    for lay in lays:
        gp = lay.global_rows()
        doc = torch.searchsorted(CU, gp.clamp_min(0), right=True) - 1
        ok = gp >= 0
        assert torch.equal(lay.position_ids[ok], (gp - CU[doc])[ok])
        assert torch.equal(lay.real, ok)


def _global_positions(lay):
    """Padded-global row of each local row."""
    return lay.index


@pytest.mark.parametrize("scheme", ["zigzag", "sequential"])
@pytest.mark.parametrize("C", [2, 4, 8])
def test_ring_case_table_covers_causal_mask_exactly(scheme, C):
    """Union over ring steps of each step's visible pairs == the global causal mask, no pair twice."""
    lays = [make_layout(CU, None, scheme=scheme, cp_size=C, rank=r) for r in range(C)]
    cu_pad = lays[0].cu_padded
    Tp = int(cu_pad[-1])
    doc = torch.repeat_interleave(torch.arange(CU.numel() - 1), cu_pad.diff())
    i = torch.arange(Tp)
    want = (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None])
    got = torch.zeros(Tp, Tp, dtype=torch.int64)
    for r, lay in enumerate(lays):
        plan = causal_plan(lay)
        for s in range(C):
            sp = plan.for_step(s)
            if sp is None:
                continue
            src = lays[(r - s) % C]
            qg = lay.index if sp.q_rows is None else lay.index[sp.q_rows]
            kg = src.index if sp.k_rows is None else src.index[sp.k_rows]
            m = sp.spec.dense()
            got[qg[:, None].expand_as(m)[m], kg[None, :].expand_as(m)[m]] += 1
    assert got.max() <= 1, "a pair was computed twice"
    assert torch.equal(got.bool(), want)


@pytest.mark.parametrize("C", [2, 4, 8])
def test_zigzag_work_is_equal_and_matches_cost_model(C):
    per_rank = [sum(causal_plan(make_layout(CU, None, cp_size=C, rank=r)).pairs_per_step()) for r in range(C)]
    assert len(set(per_rank)) == 1
    assert per_rank[0] == cost_model.zigzag_pairs(CU, C)
    seq = [sum(causal_plan(make_layout(CU, None, scheme="sequential", cp_size=C, rank=r)).pairs_per_step())
           for r in range(C)]
    assert seq == [cost_model.sequential_pairs(CU, C, r) for r in range(C)]
    assert seq == sorted(seq) and seq[-1] > seq[0]


@pytest.mark.parametrize("C", [2, 4])
def test_block_prefix_plan_covers_block_mask(C):
    """DFlash trunk visibility [doc start, anchor) is covered exactly once by the zigzag steps."""
    anchors = torch.tensor([0, 2, 3, 20, 39, 40, 41, 63, 64, 92])
    lays = [make_layout(CU, None, cp_size=C, rank=r) for r in range(C)]
    doc, _pos, owner, local, back = lays[0].locate(anchors)
    Tr = int(CU[-1])
    got = torch.zeros(anchors.numel(), Tr, dtype=torch.int64)
    for r, lay in enumerate(lays):
        mine = torch.nonzero(owner == r).flatten()
        plan = prefix_plan(lay, doc[mine], local[mine], back[mine], torch.ones(mine.numel(), dtype=torch.bool))
        for s in range(C):
            sp = plan.for_step(s)
            if sp is None or sp.spec.num_q == 0:
                continue
            src = lays[(r - s) % C]
            rows = mine if sp.q_rows is None else mine[sp.q_rows]
            kg = (src.global_rows() if sp.k_rows is None else src.global_rows()[sp.k_rows])
            m = sp.spec.dense()
            for qi, row in enumerate(rows.tolist()):
                ks = kg[m[qi]]
                assert (ks >= 0).all(), "a block saw a padding key"
                got[row, ks] += 1
    j = torch.arange(Tr)
    want = (j[None, :] >= CU[doc][:, None]) & (j[None, :] < anchors[:, None])
    assert got.max() <= 1 and torch.equal(got.bool(), want)


def test_locate_owner_and_bad_tokens():
    lay = make_layout(CU, None, cp_size=2, rank=0)
    doc, pos, _owner, _local, _back = lay.locate(torch.tensor([0, 40, 92]))
    assert doc.tolist() == [0, 2, 4] and pos.tolist() == [0, 0, 28]
    for r in range(2):
        lr = make_layout(CU, None, cp_size=2, rank=r)
        tok = torch.arange(int(CU[-1]))
        _, _, own, loc, _ = lr.locate(tok)
        mine = own == r
        assert torch.equal(lr.global_rows()[loc[mine]], tok[mine])
    with pytest.raises(ValueError, match=r"token indices must lie in \[0, 93\)"):
        lay.locate(torch.tensor([93]))


def test_layout_errors():
    with pytest.raises(ValueError, match="scheme"):
        make_layout(CU, None, scheme="ring")
    with pytest.raises(ValueError, match="rank 3 outside a group of 2"):
        make_layout(CU, None, cp_size=2, rank=3)
    with pytest.raises(ValueError, match="shard expects 93 rows"):
        make_layout(CU, None, cp_size=2, rank=0).shard(torch.zeros(92, 1))


@pytest.mark.parametrize("ring", ["sequential", "zigzag"])
@pytest.mark.parametrize("U,R", [(1, 2), (2, 1), (2, 2), (1, 4), (2, 4)])
def test_usp_batch_columns(ring, U, R):
    """Every padded column is held by exactly one rank; after the Ulysses gather a ring rank holds
    its contiguous block (sequential) or chunks r and 2R-1-r (zigzag), in increasing order."""
    from kernels.attention.usp import UspBatch
    C = U * R
    b = UspBatch([37, 5, 64], C, ulysses=U, ring=ring)
    assert b.s_pad % (2 * C if ring == "zigzag" else C) == 0 and b.s_pad >= 64
    cols = [b.position_ids(g) for g in range(C)]
    assert sorted(torch.cat(cols).tolist()) == list(range(b.s_pad))
    half = b.s_pad // (2 * R)
    for r in range(R):
        gathered = torch.cat([cols[r * U + u] for u in range(U)])
        if ring == "sequential":
            want = torch.arange(r * b.s_pad // R, (r + 1) * b.s_pad // R)
        else:
            want = torch.cat([torch.arange(r * half, (r + 1) * half),
                              torch.arange((2 * R - 1 - r) * half, (2 * R - r) * half)])
        assert torch.equal(gathered, want)
    xb = torch.arange(3 * b.s_pad).view(3, b.s_pad)
    assert torch.equal(b.local(xb, C - 1)[0], cols[C - 1])
    with pytest.raises(ValueError, match="ring must be"):
        UspBatch([4], 2, ring="ladder")
