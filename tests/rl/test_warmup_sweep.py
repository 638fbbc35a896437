"""repro.rl.warmup_sweep: the derived profiles differ from the profile only in the drafts' warm-up (and the
artifact's steps), and bad arguments are refused before any run starts.

    .venv/bin/python -m pytest -q tests/rl/test_warmup_sweep.py
"""
import copy

import pytest

from repro.rl.config import load_run_profile
from repro.rl.warmup_sweep import derived_profile, main


def _without_warmup(prof):
    prof = copy.deepcopy(prof)
    for spec in prof["rl"]["drafts"].values():
        spec.pop("lr_warmup_steps", None)
    return prof


def test_derived_profile_sets_only_the_warmup_and_steps():
    prof = load_run_profile("cpu-tiny")
    before = copy.deepcopy(prof)
    out = derived_profile(prof, "fig3", warmup=7, steps=3)
    assert prof == before, "the profile itself was changed"
    assert {d["lr_warmup_steps"] for d in out["rl"]["drafts"].values()} == {7}
    assert out["fig3"]["steps"] == 3
    out["fig3"]["steps"] = before["fig3"]["steps"]
    assert _without_warmup(out) == _without_warmup(before), "something besides the warm-up and steps changed"


@pytest.mark.parametrize("argv, message", [
    (["--rows", "no draft"], "rows of fig3 with a draft"),
    (["--rows", "DFlash", "--warmups", "0,-1"], "integers >= 0"),
    (["--rows", "DFlash", "--warm-start", "/nonexistent/sft"], "is not a folder"),
])
def test_bad_arguments_exit_2_naming_the_value(tmp_path, capsys, argv, message):
    assert main(argv + ["--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "sweep.json").exists()
