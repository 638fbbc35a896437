"""The drafts' padded block attention (one masked SDPA call) against the fp64 dense oracle, and the GPU check's
harness (repro.bench.padded_attention_check) on the CPU.

    .venv/bin/python -m pytest -q tests/attention/test_padded_oracle.py
"""
import json

import pytest
import torch

from repro.bench import padded_attention_check as pac


@pytest.mark.parametrize("length", [1, 5, 33])
def test_padded_attention_matches_the_fp64_oracle(length):
    """Values and every gradient to 1e-10 in fp64, with anchors anywhere in the row (0 included) and an invalid
    block, whose output and gradients are zero."""
    case = pac.make_case(rows=3, blocks=4, block=4, heads=4, kv_heads=2, head_dim=8, length=length, seed=length)
    ref = pac.oracle(case, block=4)
    got = pac.run_mode(case, "default", torch.float64, "cpu")
    for name in ("out", *pac.GRADS):
        torch.testing.assert_close(got[name], ref[name], rtol=0, atol=1e-10, msg=name)
    assert got["out"][:, -4:].abs().max() == 0 and ref["q"][:, -4:].abs().max() == 0


def test_check_writes_errors_per_mode_and_rejects_bad_arguments(tmp_path, capsys):
    out = tmp_path / "check.json"
    assert pac.main(["--out", str(out), "--rows", "2", "--heads", "2", "--kv-heads", "1", "--head-dim", "8",
                     "--lengths", "3,9", "--dtypes", "float32", "--modes", "default,math", "--cpu"]) == 0
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and len(res["cases"]) == 4
    assert set(res["worst_rel_err"]) == {"float32/default", "float32/math"}
    assert max(res["worst_rel_err"].values()) < 1e-5
    assert all(max(c["rerun_max_abs_diff"].values()) == 0 for c in res["cases"])   # CPU kernels: deterministic
    assert res["provenance"]["config"]["lengths"] == [3, 9]
    with pytest.raises(SystemExit):
        pac.main(["--out", str(out), "--modes", "fast"])
    assert "['fast'] are invalid" in capsys.readouterr().err
