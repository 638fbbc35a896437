"""collect turns run folders into the tidy table from each run's metrics.jsonl (W&B offline or disabled alike),
labels this machine's runs and the reference machines' apart, and a broken run folder is named and skipped while
everything else is written.

    .venv/bin/python -m pytest -q tests/report/test_collect.py
"""
import json

import pytest

from repro.core.metrics import MetricsLogger
from repro.report.collect import TIDY_COLUMNS, collect, read_tidy
from repro.report.collect import main as collect_main

pytestmark = pytest.mark.timeout(120)


def _log(run_dir, rows, artifact="fig7"):
    with MetricsLogger(run_dir, artifact=artifact, profile="cpu-tiny", config={}) as log:
        for row, step, metrics in rows:
            log.log(metrics, row=row, step=step)


ROWS = [("pp=4", 0, {"speedup_vs_host_staging": 5.25, "write_bandwidth_gbps": 0.125}),
        ("pp=4", 1, {"speedup_vs_host_staging": 6.0}),
        ("pp=2", 0, {"draft_slowdown_pct": -0.5})]


@pytest.mark.parametrize("mode", ["offline", "disabled"])
def test_collect_reads_what_was_logged(tmp_path, monkeypatch, mode):
    monkeypatch.setenv("WANDB_MODE", mode)
    _log(tmp_path / "results" / "hw" / "cpu-tiny" / "fig7", ROWS)
    tidy, runs, bad = collect(tmp_path / "results")
    assert list(tidy.columns) == TIDY_COLUMNS and not bad
    got = {(r.row, r.step, r.metric): r.value for r in tidy.itertuples()}
    want = {(row, step, k): v for row, step, m in ROWS for k, v in m.items()}
    assert got == want
    assert set(tidy["artifact"]) == {"fig7"} and set(tidy["profile"]) == {"cpu-tiny"}
    assert runs.iloc[0]["source"] == "metrics.jsonl"          # the suite's own log, whatever W&B did


def test_this_machine_and_reference_runs_are_labelled_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    here = tmp_path / "results" / "cpu-2c-x" / "cpu-tiny"
    _log(here / "fig7", ROWS)
    _log(tmp_path / "results" / "reference" / "1xh200-y" / "cpu-tiny" / "fig7", ROWS)
    tidy, _, bad = collect(tmp_path / "results", here=here)
    labels = sorted(set(tidy["hardware_label"]))
    assert not bad and labels == ["cpu-emulated, reference", "cpu-emulated, this machine"]


def test_collect_cli_writes_tidy_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    _log(tmp_path / "results" / "a" / "cpu-tiny" / "fig7", ROWS)
    _log(tmp_path / "results" / "a" / "cpu-tiny" / "fig5", [("cp=2", 0, {"speedup_vs_best_usp": 3.0})], "fig5")
    out = tmp_path / "tidy" / "fig5.csv"
    assert collect_main(["--results", str(tmp_path / "results"), "--artifact", "fig5", "--tidy-file", str(out)]) == 0
    df = read_tidy(out)
    assert list(df["metric"]) == ["speedup_vs_best_usp"] and list(df["value"]) == [3.0]
    assert not list(out.parent.glob(".*.tmp"))


@pytest.mark.parametrize("breakage,message", [
    ("half_env", "not valid JSON"),
    ("killed", "did not finish"),
    ("no_log", "has neither metrics.jsonl nor a wandb"),
    ("bad_line", "metrics.jsonl:1: not a JSON object"),
])
def test_a_bad_run_folder_is_named_skipped_and_fails_after_the_rest_is_written(tmp_path, monkeypatch, capsys,
                                                                             breakage, message):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    results = tmp_path / "results"
    _log(results / "a" / "cpu-tiny" / "fig7", ROWS)
    run = results / "a" / "cpu-tiny" / "fig5"
    run.mkdir(parents=True)
    env = {"artifact": "fig5", "profile": "cpu-tiny", "finished": breakage != "killed", "wandb_mode": "offline"}
    (run / "env.json").write_text('{"artifact": "fig5", ' if breakage == "half_env" else json.dumps(env))
    if breakage in ("killed", "bad_line"):
        (run / "metrics.jsonl").write_text('{"row": "cp=2", "step": 0, "x": 1}\n' if breakage == "killed"
                                           else "{not json\n")
    assert collect_main(["--results", str(results), "--out", str(tmp_path / "tidy")]) == 1
    err = capsys.readouterr().err
    assert str(run) in err and message in err
    tidy = read_tidy(tmp_path / "tidy" / "metrics.csv")      # everything else is there
    assert set(tidy["artifact"]) == {"fig7"} and len(tidy) == 4
    assert (tmp_path / "tidy" / "runs.csv").is_file()


def test_a_cut_off_last_row_is_not_a_row(tmp_path, monkeypatch):
    """A kill during a write leaves half a line: the rows before it count, the half line does not."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run = tmp_path / "results" / "a" / "cpu-tiny" / "fig7"
    _log(run, ROWS)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"row": "pp=4", "step": 2, "speedup_vs_')
    tidy, _, bad = collect(tmp_path / "results")
    assert not bad and sorted(set(tidy["step"])) == [0, 1]


def test_collecting_one_artifact_skips_other_artifacts_runs_unread(tmp_path, monkeypatch):
    """The workflow collects fig3 while fig4's jobs still write their logs: a run of another artifact (here still
    running) must be filtered out by its env.json before its log is read."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    _log(tmp_path / "results" / "a" / "cpu-tiny" / "fig5", [("cp=2", 0, {"speedup_vs_best_usp": 3.0})], "fig5")
    busy = tmp_path / "results" / "a" / "cpu-tiny" / "fig4" / "summary"
    busy.mkdir(parents=True)
    (busy / "env.json").write_text('{"artifact": "fig4", "profile": "cpu-tiny", "finished": false}')
    (busy / "metrics.jsonl").write_text("")
    tidy, _, bad = collect(tmp_path / "results", artifact="fig5")
    assert list(tidy["metric"]) == ["speedup_vs_best_usp"] and not bad
    _, _, bad = collect(tmp_path / "results")                 # read unfiltered, it is a run that did not finish
    assert len(bad) == 1 and "did not finish" in bad[0]


def test_online_collection_uses_scan_history():
    class FakeRun:
        id, group, tags = "abc", "fig5", ["profile:h200", "hw:1xh200"]
        config = {"artifact": "fig5", "profile": "h200", "hardware": "1xh200"}

        def scan_history(self):
            yield {"_step": 0, "row": "cp=2", "step": 0, "speedup_vs_best_usp": 3.5}

    class FakeApi:
        def runs(self, project, filters):
            assert project == "me/proj" and filters == {"group": "fig5"}
            return [FakeRun()]

    from repro.report.collect import collect_online
    df = collect_online("me/proj", {"group": "fig5"}, api=FakeApi())
    assert df.to_dict("records") == [{"artifact": "fig5", "profile": "h200", "hardware": "1xh200",
                                       "hardware_label": "", "run": "wandb:me/proj/abc", "engine": "suite",
                                       "row": "cp=2", "step": 0, "metric": "speedup_vs_best_usp", "value": 3.5}]


@pytest.mark.parametrize("mode", ["offline", "disabled"])
def test_resumed_run_keeps_every_logged_step_once(tmp_path, monkeypatch, mode):
    """Killed after logging step 2, resumed from the checkpoint of step 1: step 2 is logged again and every step is
    in the sidecar exactly once; env.json records the resume."""
    monkeypatch.setenv("WANDB_MODE", mode)
    run = tmp_path / "results" / "hw" / "cpu-tiny" / "table1"
    with pytest.raises(RuntimeError, match="crash"):
        with MetricsLogger(run, artifact="table1", profile="cpu-tiny", config={}) as log:
            for step in range(3):
                log.log({"reward": step / 10}, row="Qwen3-8B/DFlash", step=step)
            raise RuntimeError("crash")
    assert json.loads((run / "env.json").read_text())["finished"] is False
    with MetricsLogger(run, artifact="table1", profile="cpu-tiny", config={}, resume_at=2) as log:
        for step in range(2, 5):
            log.log({"reward": 1 + step / 10}, row="Qwen3-8B/DFlash", step=step)
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]
    tidy, runs, bad = collect(tmp_path / "results")
    assert dict(zip(tidy["step"], tidy["value"])) == {0: 0.0, 1: 0.1, 2: 1.2, 3: 1.3, 4: 1.4} and not bad
    assert bool(runs.iloc[0]["finished"]) and runs.iloc[0]["resumes"] == 1
    env = json.loads((run / "env.json").read_text())
    assert env["resumes"][0]["at_step"] == 2 and env["resumes"][0]["kept_rows"] == 2
