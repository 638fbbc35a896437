"""Figure/table makers for Figures 5 and 6 build from tidy rows alone and put the paper's numbers
beside the measured ones (synthetic measurements; no experiment is run).

Run: .venv/bin/python -m pytest -q tests/attention/test_reports.py
"""
import pandas as pd
import pytest

from repro.report.artifacts import fig5, fig6
from repro.report.paper import load_paper_numbers
from repro.report.style import apply_style

pytestmark = pytest.mark.timeout(120)


def _tidy(artifact, rows):
    return pd.DataFrame([{"artifact": artifact, "profile": "cpu-tiny", "hardware": "cpu-2c",
                          "hardware_label": "cpu-emulated", "run": "r", "engine": "suite", "row": r, "step": i,
                          "metric": m, "value": v} for i, (r, m, v) in enumerate(rows)])


def test_fig5_build_joins_paper(tmp_path):
    rows = [("zigzag cp=2", "time_s", 1.0), ("zigzag cp=2", "peak_mem_gb", 0.1),
            ("usp U=1 R=2 cp=2", "time_s", 3.0), ("usp U=1 R=2 cp=2", "peak_mem_gb", 0.3),
            ("usp U=2 R=1 cp=2", "time_s", 2.5), ("usp U=2 R=1 cp=2", "peak_mem_gb", 0.4),
            ("cp=2", "speedup_vs_best_usp", 2.5), ("cp=2", "peak_mem_ratio_usp_over_zigzag", 4.0),
            ("all", "usp_pad_factor", 2.25)]
    paper = load_paper_numbers()
    apply_style()
    paths = fig5.build(_tidy("fig5", rows), paper[paper["artifact"] == "fig5"], tmp_path)
    assert {p.suffix for p in paths} == {".pdf", ".png", ".csv", ".md"}
    table = pd.read_csv(tmp_path / "fig5.csv")
    sp = table[(table["row"] == "cp=2") & (table["metric"] == "speedup_vs_best_usp")].iloc[0]
    assert sp["measured"] == 2.5 and sp["paper"] == 2.9
    assert table[table["metric"] == "usp_pad_factor"]["paper"].iloc[0] == 2.25


def test_fig6_build_joins_paper(tmp_path):
    rows = [(f"{k} {t}K cp={c}", m, v) for k in ("ttt", "block") for t in (16, 256) for c in (1, 2)
            for m, v in (("time_s", 0.1 * t / c), ("peak_mem_gb", t / c / 10))]
    rows += [("ttt 256K", "speedup_cp2_over_cp1", 1.9), ("ttt 256K cp=1", "branch_overhead_pct", 1.5)]
    paper = load_paper_numbers()
    apply_style()
    paths = fig6.build(_tidy("fig6", rows), paper[paper["artifact"] == "fig6"], tmp_path)
    assert (tmp_path / "fig6.png").exists() and len(paths) == 4
    table = pd.read_csv(tmp_path / "fig6.csv")
    t = table[(table["row"] == "ttt 256K cp=1") & (table["metric"] == "time_s")].iloc[0]
    assert t["measured"] == pytest.approx(25.6) and t["paper"] == 17.7
    with pytest.raises(ValueError, match="no fig6 rows"):
        fig6.build(_tidy("fig6", [("nonsense", "time_s", 1.0)]), paper, tmp_path)
