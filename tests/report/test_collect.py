"""collect turns run folders into the tidy table: from W&B logs, or from the sidecar when W&B was
disabled; broken run folders fail with an error naming the file.

    .venv/bin/python -m pytest -q tests/report/test_collect.py
"""
import pytest

from repro.report.collect import TIDY_COLUMNS, collect, main as collect_main, read_tidy
from repro.core.metrics import MetricsLogger

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
    tidy, runs = collect(tmp_path / "results")
    assert list(tidy.columns) == TIDY_COLUMNS
    got = {(r.row, r.step, r.metric): r.value for r in tidy.itertuples()}
    want = {(row, step, k): v for row, step, m in ROWS for k, v in m.items()}
    assert got == want
    assert set(tidy["artifact"]) == {"fig7"} and set(tidy["profile"]) == {"cpu-tiny"}
    assert runs.iloc[0]["source"] == ("metrics.jsonl" if mode == "disabled" else "wandb-offline")


def test_collect_cli_writes_tidy_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    _log(tmp_path / "results" / "a" / "cpu-tiny" / "fig7", ROWS)
    _log(tmp_path / "results" / "a" / "cpu-tiny" / "fig5", [("cp=2", 0, {"speedup_vs_best_usp": 3.0})], "fig5")
    out = tmp_path / "tidy" / "fig5.csv"
    assert collect_main(["--results", str(tmp_path / "results"), "--artifact", "fig5", "--tidy-file", str(out)]) == 0
    df = read_tidy(out)
    assert list(df["metric"]) == ["speedup_vs_best_usp"] and list(df["value"]) == [3.0]
    assert not list(out.parent.glob(".*.tmp"))


def test_half_written_env_json_is_named(tmp_path, monkeypatch, capsys):
    run = tmp_path / "results" / "x" / "cpu-tiny" / "fig5"
    run.mkdir(parents=True)
    (run / "env.json").write_text('{"artifact": "fig5", ')
    assert collect_main(["--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert "env.json" in err and "not valid JSON" in err


def test_run_without_wandb_log_is_named(tmp_path, capsys):
    run = tmp_path / "results" / "x" / "cpu-tiny" / "fig5"
    run.mkdir(parents=True)
    (run / "env.json").write_text('{"artifact": "fig5", "wandb_mode": "offline"}')
    assert collect_main(["--results", str(tmp_path / "results")]) == 2
    assert "no wandb/*/run-*.wandb log" in capsys.readouterr().err


def test_collecting_one_artifact_skips_other_artifacts_runs_unread(tmp_path, monkeypatch):
    """The workflow collects fig3 while fig4's jobs still write their logs: a run of another artifact (here with
    an empty, still-open W&B log) must be filtered out by its env.json before any log is read."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    _log(tmp_path / "results" / "a" / "cpu-tiny" / "fig5", [("cp=2", 0, {"speedup_vs_best_usp": 3.0})], "fig5")
    busy = tmp_path / "results" / "a" / "cpu-tiny" / "fig4" / "summary"
    (busy / "wandb" / "offline-run-1").mkdir(parents=True)
    (busy / "wandb" / "offline-run-1" / "run-1.wandb").write_bytes(b"")
    (busy / "env.json").write_text('{"artifact": "fig4", "profile": "cpu-tiny", "wandb_mode": "offline"}')
    tidy, _ = collect(tmp_path / "results", artifact="fig5")
    assert list(tidy["metric"]) == ["speedup_vs_best_usp"]
    with pytest.raises(Exception, match="too short for a W&B log header"):    # read unfiltered, it does fail
        collect(tmp_path / "results")


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


def test_resumed_run_keeps_every_logged_step(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = tmp_path / "results" / "hw" / "cpu-tiny" / "table1"
    with pytest.raises(RuntimeError, match="crash"):
        with MetricsLogger(run, artifact="table1", profile="cpu-tiny", config={}) as log:
            for step in range(3):
                log.log({"reward": step / 10}, row="Qwen3-8B/DFlash", step=step)
            raise RuntimeError("crash")
    # Resume from the checkpoint of step 1: step 2 is redone with a new value.
    with MetricsLogger(run, artifact="table1", profile="cpu-tiny", config={}, resume=True) as log:
        for step in range(2, 5):
            log.log({"reward": 1 + step / 10}, row="Qwen3-8B/DFlash", step=step)
    tidy, runs = collect(tmp_path / "results")
    got = dict(zip(tidy["step"], tidy["value"]))
    assert got == {0: 0.0, 1: 0.1, 2: 1.2, 3: 1.3, 4: 1.4}
    assert bool(runs.iloc[0]["finished"])
