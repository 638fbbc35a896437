"""repro.bench.step_breakdown on the cpu-tiny profile: the pieces it reports exist, are positive, and its
timers leave the engine as they found it (a later row must not run through an earlier row's wrappers).

    .venv/bin/python -m pytest -q tests/rl/test_step_breakdown.py
"""
import pytest
import torch

import repro.rollout.engine as engine_mod
from repro.bench import step_breakdown
from repro.report.profiles import load_profile


@pytest.mark.timeout(240)
def test_breakdown_of_a_block_draft_row(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    torch.set_num_threads(1)
    prof = load_profile("cpu-tiny")
    prof["rl"]["grpo"].update(prompts_per_step=2, generations_per_prompt=2, max_new_tokens=8, microbatch=4)
    verify_before = engine_mod.verify
    r = step_breakdown.breakdown_row(prof, "Qwen3-8B/DFlash", tmp_path, warmup=0, repeats=1, device="cpu")
    assert engine_mod.verify is verify_before, "the phase timers must be unwrapped after the row"
    ro = r["rollout"]
    assert ro["policy_forwards"] >= 2 and ro["gen_tokens"] > 0 and ro["ms_per_forward"] > 0
    ph = r["rollout_phases_s"]
    assert ph["policy_forward"] > 0 and ph["draft_propose"] > 0 and ph["draft_observe"] > 0
    assert r["rollout_phase_calls"]["policy_forward"] >= 2
    um = r["update_microbatch"]
    assert um["rows"] == 4 and um["policy_fwd_bwd_s"]["median"] > 0 and um["draft_fwd_bwd_s"]["median"] > 0
    assert um["sample_anchors_s"]["n"] == 1
    assert r["draft_ops"]["top_level_ops"] > 0 and r["policy_ops"]["top_level_ops"] > 0
    assert r["draft_ops"]["device_kernels"] == 0, "no CUDA kernels on a CPU run"
    assert r["update"]["time_s"]["median"] > 0
    ab = r["update_ab"]
    assert ab["rounds"] == 1 and len(ab["ratios"]) == 1 and ab["no_draft_s"]["n"] == ab["drafted_s"]["n"] == 1
    assert ab["overhead_pct"] == pytest.approx(100 * (ab["drafted_s"]["median"] / ab["no_draft_s"]["median"] - 1))


def test_rows_are_checked_before_anything_runs(tmp_path):
    with pytest.raises(SystemExit, match=r"--rows \['Qwen3-8B/Medusa'\] are not table1 rows"):
        step_breakdown.main(["--profile", "cpu-tiny", "--rows", "Qwen3-8B/Medusa", "--out", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()
