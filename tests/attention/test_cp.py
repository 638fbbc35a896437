"""Context parallelism with gloo on CPU (C = 2, 4; 8 is @slow): every path against the fp64 dense
reference to 1e-10 (out, lse, dq, dk, dv), zigzag == sequential == single rank, the USP baseline,
ring counters equal to the cost model, equal zigzag work, and bad input failing before any
communication. One process group per world size runs all cases (process start-up dominates).

Run: .venv/bin/python -m pytest -q tests/attention/test_cp.py        (add -m slow for C = 8)
"""
import pytest
import torch

from kernels.attention import cost_model
from kernels.attention.selfcheck import Case, check_bad_inputs, run_cases
from kernels.launch import spawn

LENGTHS = (5, 37, 1, 22, 3, 60)       # docs shorter than 2C, lengths that need padding
TOL = 1e-10


def _cases(C: int) -> list:
    cases = {
        "ttt1": Case("ttt", lengths=LENGTHS, passes=1),
        "ttt3": Case("ttt", lengths=LENGTHS, passes=3),
        "ttt3_torch": Case("ttt", lengths=LENGTHS, passes=3, backend="torch", seed=5),
        "ttt8_mqa": Case("ttt", lengths=LENGTHS, passes=8, heads=4, kv_heads=1, seed=2),
        "ttt2_seq": Case("ttt", lengths=LENGTHS, passes=2, scheme="sequential", seed=3),
        "block": Case("block", lengths=LENGTHS, invalid_blocks=(1,), slot_drop=0.3),
        "block_torch": Case("block", lengths=LENGTHS, backend="torch", block=3, seed=4),
        "block_nokeys": Case("block", lengths=LENGTHS, anchors=(0, 5, 42, 43, 65, 67), slot_drop=1.0),
        "block_seq": Case("block", lengths=LENGTHS, scheme="sequential", seed=6),
        "block_prefix_full": Case("block", lengths=LENGTHS, backend="prefix_full[sdpa_cpu]", seed=7),
    }
    if C == 2:
        cases["usp_2_1"] = Case("ttt", lengths=LENGTHS, passes=3, usp=(2, 1))
        cases["usp_1_2"] = Case("ttt", lengths=LENGTHS, passes=3, usp=(1, 2))
        cases["usp_zigzag_1_2"] = Case("ttt", lengths=LENGTHS, passes=2, usp=(1, 2), usp_ring="zigzag")
    if C == 4:
        cases["usp_2_2"] = Case("ttt", lengths=LENGTHS, passes=3, usp=(2, 2))
        cases["usp_zigzag_2_2"] = Case("ttt", lengths=LENGTHS, passes=3, usp=(2, 2), usp_ring="zigzag")
    return cases


def _run(C: int) -> dict:
    cases = _cases(C)
    res = spawn(run_cases, C, args=(list(cases.values()),), timeout_s=280)
    bad = spawn(check_bad_inputs, C, timeout_s=120)
    return {"cases": cases, "res": {n: [r[i] for r in res] for i, n in enumerate(cases)}, "bad": bad}


@pytest.fixture(scope="module", params=[2, 4, pytest.param(8, marks=pytest.mark.slow)])
def world(request):
    return request.param, _run(request.param)


@pytest.mark.timeout(600)
def test_every_path_matches_dense_reference(world):
    C, w = world
    fails = {}
    for name, per_rank in w["res"].items():
        for r in per_rank:
            bad = {k: v for k, v in r["err"].items() if not v <= TOL}
            if bad:
                fails[f"{name}@rank{r['rank']}"] = bad
    assert not fails, f"C={C}: {fails}"


@pytest.mark.timeout(600)
def test_counters_equal_cost_model(world):
    """Forward bytes 2(C-1)(N/C) G D b per pass whatever the branches; backward adds C fp32... hops."""
    C, w = world
    for name, per_rank in w["res"].items():
        case = w["cases"][name]
        if case.usp:
            continue
        for r in per_rank:
            want = cost_model.ring_bytes(r["num_local"], C, case.kv_heads, case.dim, 8, 8)
            assert r["stats"]["bytes"] == want, f"{name} rank {r['rank']}: {r['stats']['bytes']} != {want}"
            assert r["stats"]["messages"] == cost_model.ring_messages(C)


@pytest.mark.timeout(600)
def test_zigzag_work_equal_per_rank(world):
    C, w = world
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()])
    for name in ("ttt1", "ttt3"):
        pairs = [r["stats"]["pairs"]["fwd"] for r in w["res"][name]]
        assert pairs == [cost_model.zigzag_pairs(cu, C)] * C
    seq = [r["stats"]["pairs"]["fwd"] for r in w["res"]["ttt2_seq"]]
    assert seq == [cost_model.sequential_pairs(cu, C, r) for r in range(C)]


@pytest.mark.timeout(600)
def test_usp_pad_factor_reported(world):
    C, w = world
    for name, per_rank in w["res"].items():
        if w["cases"][name].usp:
            L = sum(LENGTHS)
            mult = 2 * C if w["cases"][name].usp_ring == "zigzag" else C
            s_pad = -(-max(LENGTHS) // mult) * mult
            assert per_rank[0]["pad_factor"] == pytest.approx(len(LENGTHS) * s_pad / L)


@pytest.mark.timeout(600)
def test_bad_input_raises_before_communication(world):
    _C, w = world
    for per_rank in w["bad"]:
        for name, err, msg, comm_calls in per_rank:
            assert err is not None, f"{name}: no error raised"
            assert comm_calls == 0, f"{name}: {comm_calls} communication calls before the error"
    msgs = {n: m for n, _, m, _ in w["bad"][0]}
    assert "must be a multiple of key/value heads" in msgs["heads_not_divisible"]
    assert "group has size" in msgs["wrong_group_size"]
    assert "owned by other ranks" in msgs["block_anchor_not_owned"]
    assert "Ulysses degree to divide both head counts" in msgs["usp_heads"]
    assert "pass the Layout that sharded the inputs" in msgs["cu_bare_under_cp"]
    assert "shard expects 25 rows" in msgs["cu_total_vs_real_tokens"]
    for name in ("integer_qkv", "integer_block_qkv", "usp_integer"):
        assert "floating-point" in msgs[name], (name, msgs[name])
