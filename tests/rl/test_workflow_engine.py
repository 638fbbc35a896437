"""The workflow's ``--config engine=``: the paper profiles' rows planned on the suite's own engine.

``snakemake table1 --config profile=paper-h100 engine=suite checkpoint_root=<root>`` plans every row as
``torchrun -m repro.rl.dist_run --engine suite --checkpoint-root <root>`` on the policy's mesh, with no
SFT job, into ``results/<hw>/paper-h100-suite``; the root here holds the tiny Qwen3 checkpoint and
EAGLE-3 draft of test_paper_profile_suite under the profile's folder names, and every planned row's
config validates against it. A bad engine, a missing checkpoint_root and engine=nemo-rl on a profile
without a nemo_rl: section fail before planning, naming the value; the default (NeMo-RL) plan is unchanged.

    .venv/bin/python -m pytest -q tests/rl/test_workflow_engine.py
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from repro.core.profile import load_profile
from repro.core.provenance import hardware

from .test_paper_profile_suite import CKPT_DIR, EAGLE3_DIR, ckpt_root  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


def snakemake(*args):
    return subprocess.run([sys.executable, "-m", "snakemake", *args], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=110)


def planned(*config):
    """The commands the workflow's rules run (its rules run what repro.plan plans; a dry run does not print them)."""
    out = subprocess.run([sys.executable, "-m", "repro.plan", "--profile", "paper-h100", "--artifact", "table1",
                          "--config", *config], check=False, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def paper_root(ckpt_root, tmp_path_factory):  # noqa: F811 (fixture imported above)
    """A checkpoint root in paper-h100's layout: its policies and EAGLE-3 draft are the tiny ones (links)."""
    root = tmp_path_factory.mktemp("paper-ckpts")
    ckpts = load_profile("paper-h100")["checkpoints"]
    for key, folder in ckpts.items():
        if key == "qwen3-8b-eagle3":
            (root / folder).symlink_to(ckpt_root / EAGLE3_DIR)
        elif key in ("qwen3-8b", "qwen3.5-35b-a3b"):
            (root / folder).symlink_to(ckpt_root / CKPT_DIR)
        else:                                      # block-draft checkpoints: only the NeMo-RL engine reads them
            (root / folder).mkdir()
    return root


def test_suite_engine_plans_the_paper_rows_as_torchrun_commands(paper_root):
    out = snakemake("-n", "-p", "--forceall", "table1", "--config", "profile=paper-h100", "engine=suite",
                    f"checkpoint_root={paper_root}")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    plan = planned("engine=suite", f"checkpoint_root={paper_root}")
    cmds = [line for line in plan.splitlines() if "-m repro.rl.dist_run" in line]
    rows = load_profile("paper-h100")["table1"]["rows"]
    assert len(cmds) == len(rows), text
    runs = f"results/{hardware()['tag']}/paper-h100-suite/table1"
    for row in rows:
        mesh = {"Qwen3-8B": "--pp 4 --cp 2", "Qwen3.5-35B-A3B": "--pp 8 --cp 1"}[row.split("/")[0]]
        folder = re.sub(r"[^a-z0-9.-]+", "_", row.lower()).strip("_")
        want = (f"-m torch.distributed.run --standalone --nproc-per-node 8 -m repro.rl.dist_run --artifact table1 "
                f"--row {shlex.quote(row)} --profile paper-h100 --engine suite --checkpoint-root {paper_root} {mesh} "
                f"--out {runs}/{folder} --seed 0 --log-artifact artifact --restart-on-config-change")
        assert any(want in c for c in cmds), f"{want}\nnot among\n" + "\n".join(cmds)
        assert f"{runs}/{folder}/run.json" in text, text            # the workflow's DAG holds the same runs
    assert "rl_sft" not in text and "integrations.nemo_rl" not in plan and "--warm-start" not in plan
    assert "--results results/" in plan and "paper_figures/paper-h100-suite/table1.md" in text
    # every planned row's config holds against this root (the draft checkpoint included)
    check = subprocess.run([sys.executable, "-m", "repro.rl.config", "--profile", "paper-h100", "--artifact",
                            "table1", "--checkpoint-root", str(paper_root)], check=False, cwd=ROOT,
                           capture_output=True, text=True, timeout=110)
    assert check.returncode == 0, check.stderr
    assert check.stdout.count('"checkpoint": "qwen3-8b-eagle3"') == 1


@pytest.mark.parametrize("config,message", [
    (["profile=paper-h100", "engine=foo"], r"'foo' is not one of \['suite', 'nemo-rl'\]"),
    (["profile=paper-h100", "engine=suite"],
     r"engine=suite on profile 'paper-h100' .*checkpoint_root is not set: add --config checkpoint_root=/path"),
    (["profile=cpu-tiny", "engine=nemo-rl"], r"engine=nemo-rl is invalid for profile 'cpu-tiny': it has no nemo_rl:"),
])
def test_engine_choices_that_cannot_work_fail_before_planning(config, message):
    out = snakemake("-n", "table1", "--config", *config)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and re.search(message, text), text
    assert "Building DAG" not in text


def test_default_engine_of_a_paper_profile_is_still_nemo_rl():
    out = snakemake("-n", "-p", "--forceall", "table1", "--config", "profile=paper-h100")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    plan = planned()
    assert plan.count("-m integrations.nemo_rl.run --artifact table1") == 6 and "dist_run" not in plan
    assert f"results/{hardware()['tag']}/paper-h100/table1/qwen3-8b_eagle-3" in text and "-suite" not in text


@pytest.mark.skipif(hardware()["gpus"]["count"] > 0, reason="checks the refusal on a CPU-only machine")
def test_suite_engine_needs_neither_nemo_rl_nor_its_draft_checkpoints(ckpt_root, tmp_path):  # noqa: F811
    root = tmp_path / "ckpts"                      # only what the rl: section loads
    root.mkdir()
    (root / "Qwen3-8B").symlink_to(ckpt_root / CKPT_DIR)
    (root / "Qwen3-8B-EAGLE3").symlink_to(ckpt_root / EAGLE3_DIR)
    out = snakemake("-c1", "table1", "--config", "profile=paper-h100", "engine=suite", f"checkpoint_root={root}")
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "profile 'paper-h100' cannot run on this machine" in text, text
    assert "GPU" in text and "checkpoint qwen3.5-35b-a3b:" in text      # the other policy is still needed
    assert "nemo_rl_dir" not in text and "Qwen3-8B-DFlash" not in text and "qwen3-8b-eagle3" not in text
    assert not list((ROOT / "results").glob("*/paper-h100-suite"))
