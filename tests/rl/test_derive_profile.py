"""repro.rl.derive_profile: a profile copy with dotted settings changed (YAML-typed values, sections made as
needed), loadable by every --profile option; bad settings exit 2 naming them and write nothing.

    .venv/bin/python -m pytest -q tests/rl/test_derive_profile.py
"""
import pytest

from repro.rl.config import load_run_profile, sft_spec
from repro.rl.derive_profile import main


def test_settings_are_typed_and_the_copy_loads(tmp_path):
    out = tmp_path / "p.yaml"
    assert main(["--profile", "cpu-tiny", "--out", str(out), "rl.sft.workloads.workplace.steps=7",
                 "rl.sft.workloads.workplace.draft_workload=math"]) == 0
    derived, base = load_run_profile(str(out)), load_run_profile("cpu-tiny")
    spec = sft_spec(derived["rl"], "workplace")
    assert (spec.steps, spec.draft_workload) == (7, "math")
    assert sft_spec(derived["rl"], "math") == sft_spec(base["rl"], "math")
    del derived["rl"]["sft"]["workloads"]
    assert derived == base, "a setting changed more than its key"


@pytest.mark.parametrize("setting, message", [("rl.grpo.lr.x=1", "'lr' is not a section"),
                                              ("rl.grpo.lr", "expected KEY=VALUE")])
def test_bad_settings_exit_2(tmp_path, capsys, setting, message):
    out = tmp_path / "p.yaml"
    assert main(["--profile", "cpu-tiny", "--out", str(out), setting]) == 2
    assert message in capsys.readouterr().err and not out.exists()
