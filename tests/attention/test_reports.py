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


def test_fig6_build_shows_the_flash4_routes_and_ratios(tmp_path):
    """The one-GPU rows (CP=1): trunk beside SDPA's cuDNN kernel, the block routes beside today's, their
    same-run ratios in the table."""
    rows = [(f"{k} {t}K cp=1", "time_s", v * t) for t in (16, 256)
            for k, v in (("ttt", 0.04), ("trunk", 0.039), ("sdpa_cudnn", 0.045), ("block", 0.001),
                         ("block_flash4", 0.0006), ("block_fused", 0.0004))]
    rows += [("trunk 256K cp=1", "speedup_vs_sdpa_cudnn", 1.17), ("block_fused 256K cp=1", "speedup_vs_block", 2.5),
             ("ttt 256K cp=1", "branch_overhead_pct", 2.1), ("ttt 256K cp=1", "peak_mem_gb", 21.0)]
    paper = load_paper_numbers()
    apply_style()
    fig6.build(_tidy("fig6", rows), paper[paper["artifact"] == "fig6"], tmp_path)
    table = pd.read_csv(tmp_path / "fig6.csv")
    got = {(r["row"], r["metric"]): r["measured"] for _, r in table.iterrows()}
    assert got[("trunk 256K cp=1", "speedup_vs_sdpa_cudnn")] == 1.17
    assert got[("block_fused 256K cp=1", "speedup_vs_block")] == 2.5
    assert got[("ttt 256K cp=1", "branch_overhead_pct")] == 2.1
    kinds = set(fig6.config_rows(_tidy("fig6", rows))["kind"])
    assert {"block_flash4", "block_fused", "sdpa_cudnn", "trunk"} <= kinds
