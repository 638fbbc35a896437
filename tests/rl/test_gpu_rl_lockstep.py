"""gpu_rl --lockstep: a policy's rows run as one repro.rl.lockstep job and land where separate runs would."""
import json

import pytest

from repro.bench import gpu_rl


@pytest.mark.timeout(600)
def test_lockstep_call_runs_the_rows_in_one_job(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = tmp_path / "call"
    assert gpu_rl.main(["--profile", "cpu-tiny", "--out", str(out), "--steps", "2", "--sft-steps", "3",
                        "--policies", "dense", "--rows", "Qwen3-8B/DFlash", "--lockstep"]) == 0
    rep = json.loads((out / "gpu_rl.json").read_text())
    assert rep["lockstep"] and set(rep["rows"]) == {"Qwen3-8B/no draft", "Qwen3-8B/DFlash"} and not rep["errors"]
    assert (out / "table1" / "lockstep_dense.log").exists()
    for name in ("qwen3-8b_no_draft", "qwen3-8b_dflash"):
        rec = json.loads((out / "table1" / name / "run.json").read_text())
        assert rec["lockstep_rows"] == ["Qwen3-8B/no draft", "Qwen3-8B/DFlash"]
    assert "rollout_speedup" in rep["summary"]["Qwen3-8B/DFlash"]


def test_seeds_must_be_baseline_seeds_of_the_artifact(tmp_path):
    with pytest.raises(SystemExit, match=r"--seeds \[7\] are not baseline_seeds of fig3 .*expected some of \[1, 2\]"):
        gpu_rl.main(["--profile", "cpu-tiny", "--out", str(tmp_path), "--artifact", "fig3", "--seeds", "2,7",
                     "--seed-replicas-only"])
    with pytest.raises(SystemExit, match="expected comma-separated integers"):
        gpu_rl.main(["--profile", "cpu-tiny", "--out", str(tmp_path), "--artifact", "fig3", "--seeds", "x"])
    assert not (tmp_path / "fig3").exists()
