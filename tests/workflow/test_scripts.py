"""The shell scripts of scripts/ (device calls and experiments): each parses, and the study script refuses to start
without the warm start it needs, saying which script makes it.

    .venv/bin/python -m pytest -q tests/workflow/test_scripts.py
"""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "scripts").rglob("*.sh"))


def test_there_are_scripts():
    assert len(SCRIPTS) >= 10


@pytest.mark.timeout(30)
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_parses(script):
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


@pytest.mark.timeout(30)
def test_cotrain_study_needs_the_warm_start(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "WARM": str(tmp_path / "missing")}
    res = subprocess.run(["bash", "scripts/device/cotrain_study.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=False)
    assert res.returncode == 2 and 'scripts/device/warm_sft.sh "0:fig3" first' in res.stderr
