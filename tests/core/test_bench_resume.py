"""A benchmark cut off mid-run continues where it stopped (repro.core.timing.BenchRun's journal, fig6's rows).

Rows of an interrupted attempt come back only for the same artifact, profile, config, commit and machine; the
finished bench.json and metrics.jsonl hold every row once, the resumed ones marked, and the journal is gone.

    .venv/bin/python -m pytest -q tests/core/test_bench_resume.py
"""
import json

import pytest

from repro.bench import fig6
from repro.core.metrics import read_sidecar
from repro.core.timing import JOURNAL, BenchRun

CFG = {"device": "cpu", "sizes": [1, 2]}


class Cut(BaseException):
    """The kill: not an Exception, so no row handler catches it (fig6 records a row's Exception and goes on)."""


def attempt(path, rows, *, config=CFG, fail_after=None):
    """Measure ``rows`` (skipping those an earlier attempt left), cut off after ``fail_after`` new ones."""
    measured = []
    with BenchRun(path, artifact="figx", profile="cpu-tiny", config=config, resume=True) as bench:
        for row in rows:
            if bench.restored(row) is not None:
                continue
            if fail_after is not None and len(measured) == fail_after:
                raise Cut(row)
            bench.record(row, {"row": row}, [0.1, 0.2, 0.3], extra={"peak_mem_gb": 1.0})
            measured.append(row)
        bench.record("ratio", {}, extra={"speedup": 2.0})      # derived rows are never restored
    return measured


@pytest.mark.timeout(60)
def test_an_interrupted_run_resumes_its_rows_once(tmp_path):
    rows = ["a", "b", "c", "d"]
    with pytest.raises(Cut):
        attempt(tmp_path, rows, fail_after=2)
    assert not (tmp_path / "bench.json").exists() and (tmp_path / JOURNAL).is_file()
    with pytest.raises(Cut):                        # a second cut keeps the first attempt's rows too
        attempt(tmp_path, rows, fail_after=1)
    assert attempt(tmp_path, rows) == ["d"]
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert [r["row"] for r in bench["records"]] == ["a", "b", "c", "d", "ratio"]
    assert [r["row"] for r in bench["records"] if r.get("resumed")] == ["a", "b", "c"]
    assert bench["summary"]["resumed_rows"] == ["a", "b", "c"]
    assert all(r["samples_s"] == [0.1, 0.2, 0.3] for r in bench["records"][:4])
    assert [r["row"] for r in read_sidecar(tmp_path / "metrics.jsonl")] == ["a", "b", "c", "d", "ratio"]
    assert not (tmp_path / JOURNAL).exists()
    assert attempt(tmp_path, rows) == rows          # a finished run is measured again in full


@pytest.mark.timeout(60)
def test_another_config_or_a_torn_journal_restores_nothing(tmp_path):
    with pytest.raises(Cut):
        attempt(tmp_path, ["a", "b", "c"], fail_after=2)
    with pytest.raises(Cut):
        attempt(tmp_path, ["a", "b", "c"], config={**CFG, "sizes": [1, 2, 3]}, fail_after=1)
    lines = (tmp_path / JOURNAL).read_text().splitlines()
    assert len(lines) == 2                          # the other config's attempt started a journal of its own
    (tmp_path / JOURNAL).write_text(lines[0] + "\n" + lines[1][:-5])      # a record cut off mid-write
    assert attempt(tmp_path, ["a", "b", "c"], config={**CFG, "sizes": [1, 2, 3]}) == ["a", "b", "c"]


@pytest.mark.timeout(120)
def test_fig6_continues_after_a_cut(tmp_path, monkeypatch):
    args = ["--cp", "1", "--tokens", "256", "--repeats", "1", "--kinds", "ttt,trunk,block", "--out", str(tmp_path)]
    real, calls = fig6.run_row, []

    def cut_after_two(cfg, C, timeout_s):
        if len(calls) == 2:
            raise Cut(cfg["kind"])
        calls.append(cfg["kind"])
        return real(cfg, C, timeout_s)

    monkeypatch.setattr(fig6, "run_row", cut_after_two)
    with pytest.raises(Cut):
        fig6.main(args)
    assert calls == ["ttt", "trunk"]

    def counting(cfg, C, timeout_s):
        calls.append(cfg["kind"])
        return real(cfg, C, timeout_s)

    monkeypatch.setattr(fig6, "run_row", counting)
    assert fig6.main(args) == 0
    assert calls == ["ttt", "trunk", "block"]        # the second attempt measured only the row left
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert bench["summary"]["resumed_rows"] == ["ttt 256 cp=1", "trunk 256 cp=1"]
    overhead = next(r for r in bench["records"] if "branch_overhead_pct" in r["metrics"])
    times = {r["row"]: r["metrics"]["cpu_critical_s"] for r in bench["records"] if "cpu_critical_s" in r["metrics"]}
    assert overhead["metrics"]["branch_overhead_pct"] == pytest.approx(
        100 * (times["ttt 256 cp=1"] / times["trunk 256 cp=1"] - 1))
