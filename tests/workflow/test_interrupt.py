"""Safe to interrupt: SIGKILL the whole workflow at several moments (while a run starts W&B, mid-run between
checkpoints, while the reports are written), rerun the same command, and the outputs equal an uninterrupted run's:
every step logged exactly once, the resumed runs recorded, no earlier good file lost.

    .venv/bin/python -m pytest -q tests/workflow/test_interrupt.py
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from .workdir import Workdir

pytestmark = pytest.mark.timeout(900)
DETERMINISTIC = ("train/reward", "train/policy_loss", "train/draft_loss", "train/acceptance_length",
                 "train/gen_tokens", "val/accuracy")


def kill_when(wd: Workdir, ready, timeout: float = 300) -> bool:
    """Start `snakemake table1` in its own process group and SIGKILL the group once ``ready()``; False if the
    workflow ended first."""
    proc = subprocess.Popen(wd.cmd("table1"), cwd=wd.path, env=wd.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if ready():
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.02)
        return False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def rows_logged(run: Path) -> int:
    path = run / "metrics.jsonl"
    return path.read_text().count("\n") if path.is_file() else -1


def steps_of(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def deterministic(tidy: Path) -> pd.DataFrame:
    df = pd.read_csv(tidy, keep_default_na=False)
    df = df[df["metric"].isin(DETERMINISTIC)]
    return df[["row", "step", "metric", "value"]].sort_values(["row", "step", "metric"]).reset_index(drop=True)


class Reference:
    """An uninterrupted `snakemake table1` in its own workflow copy, started once for this module: the killed run's
    reference (the two run side by side, one core each) and, once finished, the tree the broken-folder test
    collects."""

    def __init__(self, wd: Workdir, log: Path):
        self.wd, self.log = wd, log
        self._log = open(log, "w")
        self.proc = subprocess.Popen(wd.cmd("table1"), cwd=wd.path, env=wd.env, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    def finished(self) -> Workdir:
        assert self.proc.wait(timeout=600) == 0, self.log.read_text()[-3000:]
        return self.wd

    def stop(self) -> None:
        if self.proc.poll() is None:              # a failed test leaves no workflow running behind it
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    ref = Reference(Workdir(tmp_path_factory.mktemp("reference")), tmp_path_factory.getbasetemp() / "reference.log")
    try:
        yield ref
    finally:
        ref.stop()


# the module's two tests share one reference run: under pytest-xdist they go to one worker
@pytest.mark.xdist_group("table1_reference")
def test_killed_anywhere_the_same_command_finishes_the_work(tmp_path, reference):
    wd = Workdir(tmp_path / "killed")
    first = wd.run("envcheck")                       # an earlier good result that must survive everything below
    assert first.returncode == 0, first.stderr[-2000:]
    envcheck = wd.runs / "envcheck" / "bench.json"
    before = digest(envcheck)
    table = wd.runs / "table1"
    killed_mid_run = []

    def running(min_rows: int, max_rows: int | None = None):
        """A run folder whose run is going (env.json finished: false) with this many rows logged, or None."""
        for env in table.glob("*/env.json"):
            try:
                going = json.loads(env.read_text())["finished"] is False
            except (ValueError, KeyError):
                continue
            rows = rows_logged(env.parent)
            if going and rows >= min_rows and (max_rows is None or rows <= max_rows):
                return env.parent
        return None

    # 1. a run just started: env.json written, W&B starting, nothing logged yet
    assert kill_when(wd, lambda: running(0, 0) is not None)
    # 2. a run mid-way, between checkpoints (ckpt_every 1: its first steps are checkpointed)
    assert kill_when(wd, lambda: bool(killed_mid_run.append(running(2)) or killed_mid_run[-1]))
    killed_mid_run = killed_mid_run[-1]
    sft = wd.runs / "sft" / "dense-math" / "policy.pt"
    sft_digest = digest(sft)
    # 3. while the table is written: the collected table exists, the report is being built
    assert kill_when(wd, lambda: (wd.path / "results" / "tidy" / "tiny-test" / "table1.csv").is_file())
    final = wd.run("table1")
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]

    ref = reference.finished()
    assert digest(envcheck) == before and digest(sft) == sft_digest, "an earlier good result was redone or lost"
    for run in (table / "qwen3-8b_no_draft", table / "qwen3-8b_dflash"):
        assert steps_of(run) == [0, 1, 2, 3], f"{run.name}: every step exactly once"
        assert json.loads((run / "env.json").read_text())["finished"] is True
    resumed = json.loads((killed_mid_run / "env.json").read_text())["resumes"]
    assert resumed and resumed[0]["at_step"] >= 1, f"{killed_mid_run.name} resumed from its checkpoint"
    assert json.loads((killed_mid_run / "run.json").read_text())["resumed_at"] >= 1
    got = deterministic(wd.path / "results" / "tidy" / "tiny-test" / "table1.csv")
    want = deterministic(ref.path / "results" / "tidy" / "tiny-test" / "table1.csv")
    pd.testing.assert_frame_equal(got, want)
    assert (wd.path / "paper_figures" / "tiny-test" / "table1.md").read_text().count("this machine") >= 1


@pytest.mark.xdist_group("table1_reference")
def test_a_broken_run_folder_is_named_and_the_rest_collected(reference, tmp_path):
    workdir = reference.finished().clone(tmp_path / "wf")      # the reference itself stays as it finished
    broken = workdir.path / "results" / "reference" / "other-box" / "tiny-test" / "table1" / "stale"
    broken.mkdir(parents=True)
    (broken / "env.json").write_text('{"artifact": "table1", "profile": "tiny-test", ')
    out = workdir.run("collect", "--forcerun", "collect")
    text = out.stdout + out.stderr
    assert out.returncode != 0 and str(broken.relative_to(workdir.path)) in text and "not valid JSON" in text
    tidy = pd.read_csv(workdir.path / "results" / "tidy" / "metrics.csv", keep_default_na=False)
    assert "table1" in set(tidy["artifact"])      # everything readable was written and kept
