"""The run-level exchangeability test (repro.report.exchangeability): the exact permutation p-value, its Monte Carlo
fallback, and the report from run folders.

    .venv/bin/python -m pytest -q tests/report/test_exchangeability.py
"""
import json
import math

import numpy as np
import pytest

from repro.report import exchangeability as ex

pytestmark = pytest.mark.timeout(120)


def test_exact_p_value_counts_the_splits_as_extreme_as_the_observed_one():
    # 2 vs 2 of {0, 1, 2, 3}: six splits, differences of means +-2, +-1, 0, 0 -> |d| >= 2 in 2 of 6
    d, p, method = ex.permutation_test([2, 3], [0, 1])
    assert d == 2.0 and method == "exact" and p == pytest.approx(2 / 6)
    d, p, _ = ex.permutation_test([0, 3], [1, 2])
    assert d == 0.0 and p == 1.0                       # no split is less extreme than a zero difference


def test_false_alarm_rate_holds_and_a_shift_is_detected():
    """Exchangeable groups: p < 0.05 in at most about 5% of 400 draws (the test's level); a 3-sd shift: p tiny."""
    rng = np.random.default_rng(0)
    alarms = [ex.permutation_test(rng.normal(0, 1, 4), rng.normal(0, 1, 4))[1] < 0.05 for _ in range(400)]
    assert np.mean(alarms) < 0.08
    shifted = ex.permutation_test(rng.normal(3, 1, 8), rng.normal(0, 1, 8))[1]
    assert 2 / math.comb(16, 8) <= shifted < 1e-3           # >= the smallest p an exact two-sided test can give


def test_monte_carlo_fallback_agrees_with_the_exact_value(monkeypatch):
    a, b = [0.3, 0.5, 0.4, 0.6, 0.7], [0.2, 0.1, 0.35, 0.3, 0.25]
    _, exact, _ = ex.permutation_test(a, b)
    monkeypatch.setattr(ex, "EXACT_LIMIT", 10)
    _, mc, method = ex.permutation_test(a, b)
    assert method == "monte carlo" and mc == pytest.approx(exact, abs=0.005)
    with pytest.raises(ValueError, match=">= 2 runs per group, got 1 and 2"):
        ex.permutation_test([1.0], [1.0, 2.0])


def _run(folder, row, seed, rewards, val):
    folder.mkdir(parents=True)
    (folder / "env.json").write_text(json.dumps({"config": {"row": row, "seed": 0, "sampling_seed": seed},
                                                 "hardware": {"tag": "cpu-2c"}, "git": {"sha": "abc"}}))
    lines = [{"row": row, "step": s, "train/reward": r, **({"val/accuracy": val} if s % 2 == 0 else {})}
             for s, r in enumerate(rewards)]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def test_report_from_run_folders(tmp_path, capsys):
    for k in range(3):
        _run(tmp_path / "runs" / f"no_draft_sampling{k}", "no draft", k, [0.1 + 0.01 * k] * 4, 0.2)
        _run(tmp_path / "runs" / f"eagle-3_sampling{k}", "EAGLE-3", k, [0.5 + 0.01 * k] * 4, 0.2)
    assert ex.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    reward = next(t for t in rep["tests"] if t["metric"] == "train/reward")
    assert reward["row"] == "EAGLE-3" and reward["difference"] == pytest.approx(0.4)
    assert reward["p_value"] == pytest.approx(2 / 20) and reward["runs"] == reward["baseline_runs"] == 3
    val = next(t for t in rep["tests"] if t["metric"] == "val/accuracy")
    assert val["difference"] == 0 and val["p_value"] == 1.0
    assert {r["sampling_seed"] for r in rep["runs"]} == {0, 1, 2} and rep["runs"][0]["hardware"] == "cpu-2c"
    assert "| EAGLE-3 | train/reward | 3 |" in (tmp_path / "rep" / "report.md").read_text()
    assert ex.main(["--runs", str(tmp_path / "runs"), "--baseline", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "baseline row 'nope': 0 run(s)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ex.main(["--runs", str(tmp_path / "empty"), "--out", str(tmp_path / "x")])


def test_runs_pooled_from_several_places(tmp_path):
    """--runs repeated: single run folders (a figure's baseline runs) beside a folder of new runs, each counted once."""
    for k in range(2):
        _run(tmp_path / "fig3" / f"no_draft_sampling{k}", "no draft", k, [0.1 + 0.01 * k] * 4, 0.2)
        _run(tmp_path / "new" / f"eagle-3_s{k + 1}", "EAGLE-3", k + 1, [0.3] * 4, 0.2)
    _run(tmp_path / "fig3" / "eagle-3", "EAGLE-3", 0, [0.9] * 4, 0.2)         # left out: not named
    named = [tmp_path / "fig3" / "no_draft_sampling0", tmp_path / "fig3" / "no_draft_sampling1", tmp_path / "new",
             tmp_path / "new" / "eagle-3_s1"]
    argv = [*(a for p in named for a in ("--runs", str(p))), "--out", str(tmp_path / "rep")]
    assert ex.main(argv) == 0
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    reward = next(t for t in rep["tests"] if t["metric"] == "train/reward")
    assert reward["runs"] == reward["baseline_runs"] == 2 and reward["mean"] == pytest.approx(0.3)


def test_a_row_with_one_run_is_listed_not_tested(tmp_path):
    for k in range(3):
        _run(tmp_path / "runs" / f"no_draft_sampling{k}", "no draft", k, [0.1 + 0.01 * k] * 4, 0.2)
    for k in range(2):
        _run(tmp_path / "runs" / f"eagle-3_s{k}", "EAGLE-3", k, [0.3] * 4, 0.2)
    _run(tmp_path / "runs" / "dflash", "DFlash", 0, [0.2] * 4, 0.2)
    assert ex.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    dflash = [t for t in rep["tests"] if t["row"] == "DFlash"]
    assert len(dflash) == 2 and all(t["p_value"] is None and t["method"] == "too few runs" for t in dflash)
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "p < 0.05/2 |" in md and "| - (too few runs) | - |" in md       # Bonferroni over the tested rows only
    for k in range(2):
        (tmp_path / "runs" / f"eagle-3_s{k}" / "env.json").unlink()
    assert ex.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "rep2")]) == 2   # nothing testable
