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


def test_seeds_none_and_a_profile_file(tmp_path):
    """``--seeds none`` runs no replica (so replicas alone leave nothing to run); ``--profile`` takes a .yaml file,
    e.g. one repro.rl.derive_profile wrote, and reads its settings."""
    with pytest.raises(SystemExit, match=r"nothing to run: no seed replicas of fig3 chosen .*--seeds none"):
        gpu_rl.main(["--profile", "cpu-tiny", "--out", str(tmp_path), "--artifact", "fig3", "--seeds", "none",
                     "--seed-replicas-only"])
    from repro.rl import derive_profile
    prof = tmp_path / "p.yaml"
    assert derive_profile.main(["--profile", "cpu-tiny", "--out", str(prof), "fig3.baseline_seeds=[1,2,7]"]) == 0
    with pytest.raises(SystemExit, match=r"--seeds \[9\] are not baseline_seeds of fig3 .*some of \[1, 2, 7\]"):
        gpu_rl.main(["--profile", str(prof), "--out", str(tmp_path), "--artifact", "fig3", "--seeds", "9"])


@pytest.mark.timeout(600)
def test_sft_only_then_drafted_rows_without_their_baseline(tmp_path, monkeypatch):
    """The split device calls of a long curve run: ``--sft-only`` builds the warm start into the cache and runs no
    row; ``--without-baseline`` then runs the drafted rows alone from that cache, summarised without speedups."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cache, rows = str(tmp_path / "cache"), "Qwen3-8B/DFlash,Qwen3-8B/DSpark"
    common = ["--profile", "cpu-tiny", "--sft-steps", "3", "--policies", "dense", "--rows", rows, "--sft-cache", cache]
    assert gpu_rl.main(common + ["--out", str(tmp_path / "sft"), "--sft-only"]) == 0
    rep = json.loads((tmp_path / "sft" / "gpu_rl.json").read_text())
    assert rep["sft_only"] and not rep["rows"] and sorted(rep["sft"]["dense"]["drafts"]) == ["dflash", "dspark"]
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


def test_a_row_that_would_end_past_the_deadline_is_skipped_not_cut(tmp_path, monkeypatch):
    """``--deadline-s``: a seed replica is expected to take as long as its baseline's run did in this call; one that
    would end past the deadline is skipped (and listed), so that a device call's timeout never cuts a run."""
    import time

    def fake_job(cmd, log):            # stands in for the SFT and run processes: writes what they would
        out = tmp_path.joinpath(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        if cmd[2] == "repro.rl.sft":
            (out / "sft.json").write_text(json.dumps({"drafts": {}}))
        else:
            time.sleep(0.5)
            (out / "run.json").write_text(json.dumps({"last": {"train/reward": 0.0}}))

    monkeypatch.setattr(gpu_rl, "_job", fake_job)
    common = ["--profile", "cpu-tiny", "--artifact", "fig3", "--rows", "DFlash", "--seeds", "1,2"]
    gpu_rl.main(common + ["--out", str(tmp_path / "tight"), "--deadline-s", "1.2"])
    rep = json.loads((tmp_path / "tight" / "gpu_rl.json").read_text())
    assert set(rep["rows"]) == {"no draft", "DFlash"}         # no estimate for a row's first run: it runs
    assert rep["skipped_for_deadline"] == ["no_draft_sampling1", "no_draft_sampling2"]
    gpu_rl.main(common + ["--out", str(tmp_path / "roomy"), "--deadline-s", "60"])
    rep = json.loads((tmp_path / "roomy" / "gpu_rl.json").read_text())
    assert set(rep["rows"]) == {"no draft", "DFlash", "no_draft_sampling1", "no_draft_sampling2"}
    assert "skipped_for_deadline" not in rep
