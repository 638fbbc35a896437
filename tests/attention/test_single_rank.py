"""Single-rank (group=None) front ends against the fp64 dense reference: EAGLE-3 TTT with 1..4 and
8 passes, DFlash/DSpark blocks (anchors at document start/end, partly invalid and fully masked
blocks), both CPU backends, fp32 tolerance, and bad-input errors.

Run: .venv/bin/python -m pytest -q tests/attention/test_single_rank.py
"""
import pytest
import torch

from kernels.attention import (
    block_draft_attention,
    block_draft_plan,
    causal_attention,
    dflash_block_attention,
    dspark_block_attention,
    eagle3_ttt_attention,
)
from kernels.attention.selfcheck import Case, run_case

pytestmark = pytest.mark.timeout(120)
LENGTHS = (5, 37, 1, 22, 3)
TOL = {"float64": 1e-10, "float32": 2e-5}


def _assert(res, tol):
    bad = {k: v for k, v in res["err"].items() if not v <= tol}
    assert not bad, f"errors above {tol}: {bad}"


@pytest.mark.parametrize("backend", ["torch", "sdpa_cpu"])
@pytest.mark.parametrize("passes", [1, 2, 3, 4, 8])
def test_ttt_matches_reference(backend, passes):
    _assert(run_case(0, 1, Case("ttt", lengths=LENGTHS, passes=passes, backend=backend)), 1e-10)


@pytest.mark.parametrize("backend", ["torch", "sdpa_cpu", "prefix_full[sdpa_cpu]"])
@pytest.mark.parametrize("case", [
    {},                                                        # anchors at start, middle, end of each doc
    {"invalid_blocks": (0, 3), "slot_drop": 0.5},                    # fully masked blocks, partly invalid slots
    {"anchors": (0, 5, 42, 64, 67), "slot_drop": 1.0},               # no block keys: doc-start anchors see nothing
    {"heads": 4, "kv_heads": 1, "block": 1},                            # MQA, B = 1
])
def test_blocks_match_reference(backend, case):
    _assert(run_case(0, 1, Case("block", lengths=LENGTHS, backend=backend, **case)), 1e-10)


@pytest.mark.parametrize("family", ["ttt", "block"])
def test_fp32_tolerance(family):
    _assert(run_case(0, 1, Case(family, lengths=LENGTHS, dtype="float32")), TOL["float32"])


def test_fully_masked_rows_are_zero_with_neg_inf_lse_and_zero_grad():
    cu = torch.tensor([0, 8])
    q = torch.randn(2, 2, 2, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 1, 4, dtype=torch.float64, requires_grad=True)
    ctx = torch.randn(8, 1, 4, dtype=torch.float64, requires_grad=True)
    out, lse = block_draft_attention(q, k, k, ctx, ctx, torch.tensor([0, 5]), cu,
                                     slot_valid=torch.tensor([[False, False], [True, True]]), return_lse=True)
    assert torch.isneginf(lse[0]).all() and (out[0] == 0).all() and torch.isfinite(lse[1]).all()
    out.sum().backward()
    assert (q.grad[0] == 0).all() and torch.isfinite(q.grad).all() and torch.isfinite(ctx.grad).all()


def test_aliases_and_causal_front_end():
    assert dflash_block_attention is block_draft_attention is dspark_block_attention
    cu = torch.tensor([0, 6, 16])
    q, k = torch.randn(16, 2, 4, dtype=torch.float64), torch.randn(16, 1, 4, dtype=torch.float64)
    assert torch.equal(causal_attention(q, k, k, cu), eagle3_ttt_attention(q, [k], [k], cu))


def test_bad_inputs_single_rank():
    import torch.distributed as dist

    from kernels.attention.selfcheck import check_bad_inputs
    assert not dist.is_initialized()
    cu = torch.tensor([0, 10, 26])
    q, k = torch.randn(26, 4, 8), torch.randn(26, 2, 8)
    with pytest.raises(ValueError, match="q has 25 rows but this rank holds 26"):
        eagle3_ttt_attention(q[:-1], [k[:-1]], [k[:-1]], cu)
    with pytest.raises(ValueError, match="H=3 must be a multiple of key/value heads G=2"):
        eagle3_ttt_attention(q[:, :3], [k], [k], cu)
    with pytest.raises(TypeError, match="dtype torch.float64, expected torch.float32"):
        eagle3_ttt_attention(q, [k.double()], [k], cu)
    with pytest.raises(ValueError, match="backend must be one of"):
        eagle3_ttt_attention(q, [k], [k], cu, backend="flash3")
    with pytest.raises(ValueError, match="anchors must be a 1-D tensor of 2"):
        block_draft_attention(torch.randn(2, 3, 4, 8), torch.randn(2, 3, 2, 8), torch.randn(2, 3, 2, 8), k, k,
                              torch.tensor([1]), cu)
    with pytest.raises(ValueError, match=r"token indices must lie in \[0, 26\)"):
        block_draft_attention(torch.randn(1, 3, 4, 8), torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8), k, k,
                              torch.tensor([26]), cu)
    assert callable(check_bad_inputs)


def test_a_shared_block_plan_gives_the_same_values_and_gradients():
    """block_draft_plan once, used by two calls (as the draft's layers do): outputs, lse and gradients equal the
    per-call path bit for bit; a plan for other blocks, or extra per-call arguments, are refused."""
    g = torch.Generator().manual_seed(5)
    cu = torch.tensor([0, 9, 30])
    anchors = torch.tensor([20, 0, 7, 12])
    bv = torch.tensor([True, True, False, True])
    plan = block_draft_plan(anchors, 3, cu, block_valid=bv)
    args = [torch.randn(*s, dtype=torch.float64, generator=g).requires_grad_()
            for s in ((4, 3, 4, 8), (4, 3, 2, 8), (4, 3, 2, 8), (30, 2, 8), (30, 2, 8))]
    grads = []
    for use_plan in (False, True):
        for t in args:
            t.grad = None
        outs = []
        for _ in range(2):                      # two "layers" over the same blocks
            o, l = (block_draft_attention(*args, plan, return_lse=True) if use_plan else
                    block_draft_attention(*args, anchors, cu, block_valid=bv, return_lse=True))
            outs += [o, l]
        (outs[0].square().sum() + outs[2].sum()).backward()
        grads.append(([x.detach().clone() for x in outs], [t.grad.clone() for t in args]))
    (o0, g0), (o1, g1) = grads
    for a, b in zip(o0 + g0, o1 + g1):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="BlockPlan is for 4 blocks of 3 slots"):
        block_draft_attention(args[0][:, :2], args[1][:, :2], args[2][:, :2], args[3], args[4], plan)
    with pytest.raises(ValueError, match="pass cu_seqlens/slot_valid/block_valid to block_draft_plan"):
        block_draft_attention(*args, plan, cu)
