"""repro.rl.draft_sweep: the derived profiles differ from the profile only in the swept draft setting (and the
artifact's steps), and bad arguments are refused before any run starts.

    .venv/bin/python -m pytest -q tests/rl/test_draft_sweep.py
"""
import copy

import pytest

from repro.rl.config import load_run_profile
from repro.rl.draft_sweep import derived_profile, main


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
])
def test_bad_arguments_exit_2_naming_the_value(tmp_path, capsys, argv, message):
    assert main(argv + ["--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "sweep.json").exists()


def test_only_numeric_draft_settings_are_sweepable(capsys):
    with pytest.raises(SystemExit):
        main(["--rows", "DFlash", "--key", "family", "--out", "/tmp/unused"])
    assert "invalid choice" in capsys.readouterr().err
