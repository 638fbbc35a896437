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


@pytest.mark.timeout(600)
def test_sft_only_then_drafted_rows_without_their_baseline(tmp_path, monkeypatch):
    """The split device calls of a long curve run: ``--sft-only`` builds the warm start into the cache and runs no
    row; ``--without-baseline`` then runs the drafted rows alone from that cache, summarised without speedups."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cache, rows = str(tmp_path / "cache"), "Qwen3-8B/DFlash,Qwen3-8B/DSpark"
    common = ["--profile", "cpu-tiny", "--sft-steps", "3", "--policies", "dense", "--rows", rows, "--sft-cache", cache]
    assert gpu_rl.main(common + ["--out", str(tmp_path / "sft"), "--sft-only"]) == 0
    rep = json.loads((tmp_path / "sft" / "gpu_rl.json").read_text())
    assert rep["sft_only"] and not rep["rows"] and rep["sft"]["dense"]["drafts"] == ["dflash", "dspark"]
    assert not (tmp_path / "sft" / "table1").exists()
    out = tmp_path / "rows"
    assert gpu_rl.main(common + ["--out", str(out), "--without-baseline", "--steps", "2", "--lockstep"]) == 0
    rep = json.loads((out / "gpu_rl.json").read_text())
    assert set(rep["rows"]) == {"Qwen3-8B/DFlash", "Qwen3-8B/DSpark"} and not rep["errors"]
    fig = tmp_path / "fig3"                 # a figure's drafted row alone, then one replica of its left-out baseline
    assert gpu_rl.main(["--profile", "cpu-tiny", "--sft-steps", "3", "--artifact", "fig3", "--rows", "DSpark",
                        "--without-baseline", "--seeds", "2", "--steps", "2", "--out", str(fig)]) == 0
    assert set(json.loads((fig / "gpu_rl.json").read_text())["rows"]) == {"DSpark", "no_draft_sampling2"}
    assert rep["sft"]["dense"]["reused_from_cache"] and not (out / "table1" / "qwen3-8b_no_draft").exists()
    assert "acceptance_length" in rep["summary"]["Qwen3-8B/DSpark"]
    assert "rollout_speedup" not in rep["summary"]["Qwen3-8B/DSpark"]
    with pytest.raises(SystemExit, match="--sft-only needs --sft-cache"):
        gpu_rl.main(["--profile", "cpu-tiny", "--out", str(tmp_path / "x"), "--sft-only"])
    with pytest.raises(SystemExit, match="no drafted rows"):
        gpu_rl.main(["--profile", "cpu-tiny", "--out", str(tmp_path / "x"), "--rows", "Qwen3-8B/no draft",
                     "--without-baseline"])
