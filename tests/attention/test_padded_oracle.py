"""The drafts' padded block attention (one masked SDPA call, kernels.attention.padded) against the fp64 dense oracle,
through the GPU check's padded helpers (repro.bench.attention_check) on the CPU.

    .venv/bin/python -m pytest -q tests/attention/test_padded_oracle.py
"""
import json

import pytest
import torch

from repro.bench import attention_check as ac

pytestmark = pytest.mark.timeout(180)
CFG = {"heads": 4, "kv_heads": 2, "head_dim": 8, "dtype": "float64", "device": "cpu"}
P = {"rows": 3, "blocks": 4, "block": 4}


@pytest.mark.parametrize("length", [1, 5, 33])
@pytest.mark.parametrize("mode", ["default", "math"])
def test_padded_attention_matches_the_fp64_oracle(length, mode):
    """Values and every gradient to 1e-10 in fp64, with anchors anywhere in the row (0 included) and an invalid
    block, whose output and gradients are zero."""
    case = ac.padded_case(P, CFG, length, seed=length)
    ref = ac.padded_oracle(case, P["block"], torch.device("cpu"))
    got = ac.run_padded(case, mode, torch.float64, torch.device("cpu"))
    for name in ("out", *ac.PADDED_GRADS):
        torch.testing.assert_close(got[name], ref[name], rtol=0, atol=1e-10, msg=name)
    assert got["out"][:, -4:].abs().max() == 0 and ref["q"][:, -4:].abs().max() == 0


def test_check_runs_the_padded_modes_deterministically_on_cpu(tmp_path):
    assert ac.main(["--profile", "cpu-tiny", "--out", str(tmp_path), "--paths", "padded"]) == 0
    res = json.loads((tmp_path / "attention_check.json").read_text())
    rows = [r for r in res["rows"] if r["path"] == "padded"]
    assert {r["backend"] for r in rows} == {"sdpa:default", "sdpa:math"} and res["verdict"] == "PASS"
    assert all(r["status"] == "PASS" and r["err"]["rerun_max_abs_diff"] == 0 for r in rows)   # CPU: deterministic
