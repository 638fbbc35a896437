"""studies.draft_controls.sweep: the derived profiles differ from the profile only in the swept draft setting (and the
artifact's steps), and bad arguments are refused before any run starts.

    .venv/bin/python -m pytest -q studies/draft_controls/test_sweep.py
"""
import copy

import pytest

from repro.rl.config import load_run_profile
from studies.draft_controls.sweep import derived_profile, main, run_record


def _without(prof, key):
    prof = copy.deepcopy(prof)
    for spec in prof["rl"]["drafts"].values():
        spec.pop(key, None)
    return prof


@pytest.mark.parametrize("key, value", [("lr_warmup_steps", 7), ("loss_weight", 0)])
def test_derived_profile_sets_only_the_key_and_steps(key, value):
    prof = load_run_profile("cpu-tiny")
    before = copy.deepcopy(prof)
    out = derived_profile(prof, "fig3", key, value, steps=3)
    assert prof == before, "the profile itself was changed"
    assert {d[key] for d in out["rl"]["drafts"].values()} == {value}
    assert out["fig3"]["steps"] == 3
    out["fig3"]["steps"] = before["fig3"]["steps"]
    assert _without(out, key) == _without(before, key), f"something besides draft.{key} and steps changed"


@pytest.mark.parametrize("argv, message", [
    (["--rows", "no draft"], "rows of fig3 with a draft"),
    (["--rows", "DFlash", "--values", "0,-1"], "numbers >= 0"),
    (["--rows", "DFlash", "--values", "0,x"], "comma-separated numbers"),
    (["--rows", "DFlash", "--warm-start", "/nonexistent/sft"], "is not a folder"),
    (["--rows", "DFlash", "--key", "lr", "--values", "1e-3,0"], "drafts.eagle3.lr=0.0 is invalid"),
])
def test_bad_arguments_exit_2_naming_the_value(tmp_path, capsys, argv, message):
    assert main(argv + ["--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "sweep.json").exists()


def test_only_numeric_draft_settings_are_sweepable(capsys):
    with pytest.raises(SystemExit):
        main(["--rows", "DFlash", "--key", "family", "--out", "/tmp/unused"])
    assert "invalid choice" in capsys.readouterr().err


def test_run_record_keeps_each_curve_and_the_first_update_ratio():
    hist = [{"step": 0, "train/reward": 0.1, "train/rollout_time_s": 2.0, "train/acceptance_length": 2.0,
             "train/draft_loss": 1.5, "val/accuracy": 0.5},
            {"step": 1, "train/reward": 0.3, "train/rollout_time_s": 1.0, "train/acceptance_length": 3.0,
             "train/draft_loss": 1.0}]
    rec = run_record("DFlash", "loss_weight", 0, hist)
    assert rec["loss_weight"] == 0 and rec["reward"] == [0.1, 0.3] and rec["rollout_time_s"] == [2.0, 1.0]
    assert rec["val_accuracy"] == [[0, 0.5]] and rec["draft_loss"] == [1.5, 1.0]
    assert rec["mean_acceptance_length"] == 2.5 and rec["first_update_al_ratio"] == 1.5
