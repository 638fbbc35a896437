"""Report rendering: byte-stable figures with Type 42 fonts, tables in CSV + Markdown, the paper's
numbers file, and the comparison report's ratios, expected ratios and statuses.

    .venv/bin/python -m pytest -q tests/report/test_reports.py
"""
import pandas as pd
import pytest

from repro.core.profile import load_profile
from repro.report.compare import compare_artifact, expected_ratio, standing, write_reports
from repro.report.paper import load_paper_numbers
from repro.report.style import apply_style, paper_style, save_figure
from repro.report.tables import write_table

pytestmark = pytest.mark.timeout(120)


def _figure():
    import matplotlib.pyplot as plt
    apply_style()
    fig, ax = plt.subplots()
    ax.plot([1, 2, 4, 8], [1.0, 1.9, 3.6, 6.8], marker="s", label="measured (cpu-2c)")
    ax.plot([8], [7.5], label="paper (H100)", **paper_style("marker"))
    ax.axhline(2.0, label="paper (H100)", **paper_style("line"))
    ax.set_xlabel("CP")
    ax.legend()
    return fig


def test_figures_are_byte_stable_with_type42_fonts(tmp_path):
    a = save_figure(_figure(), tmp_path / "a" / "fig")
    b = save_figure(_figure(), tmp_path / "b" / "fig")
    for pa, pb in zip(a, b):
        assert pa.read_bytes() == pb.read_bytes(), f"{pa.suffix} differs between two saves"
    pdf = a[0].read_bytes()
    assert b"/FontType 3" not in pdf and b"/Subtype /Type3" not in pdf
    assert b"/TrueType" in pdf or b"/CIDFontType2" in pdf
    assert a[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_paper_style_is_hollow_or_dashed():
    assert paper_style("marker")["markerfacecolor"] == "none"
    assert paper_style("line")["linestyle"] != "-"
    with pytest.raises(ValueError, match="expected 'marker' or 'line'"):
        paper_style("bar")


def test_tables_csv_and_markdown(tmp_path):
    df = pd.DataFrame({"row": ["EAGLE-3", "DFlash"], "acceptance_length": [2.2812, None]})
    csv, md = write_table(df, tmp_path / "t", title="T")
    assert csv.read_text().splitlines() == ["row,acceptance_length", "EAGLE-3,2.2812", "DFlash,"]
    text = md.read_text()
    assert "| EAGLE-3 | 2.281 |" in text and "| DFlash | - |" in text


def test_paper_numbers_cover_every_artifact():
    paper = load_paper_numbers()
    assert set(paper["artifact"]) == {"table1", "table2", "fig3", "fig4", "fig5", "fig6", "fig7"}
    t1 = paper[(paper["artifact"] == "table1") & (paper["metric"] == "acceptance_length")]
    assert len(t1) == 7   # seven target/draft rows in Table 1
    assert set(paper["paper_hardware"]).issubset({"8x H100", "H100", "GB200", "H100 and GB200"})


def test_bad_paper_numbers_file_is_refused(tmp_path):
    from repro.core.profile import ProfileError
    bad = tmp_path / "p.csv"
    bad.write_text("artifact,row,metric,stat,unit,paper_hardware,value,higher_is_better,scales_with,source\n"
                   "table9,x,m,value,x,H100,1.0,true,none,T\n")
    with pytest.raises(ProfileError, match="line 2: artifact: 'table9' is invalid: input should be 'table1'"):
        load_paper_numbers(bad)


def _tidy(rows):
    return pd.DataFrame([{"artifact": a, "profile": "cpu-tiny", "hardware": "cpu-2c",
                          "hardware_label": "cpu-emulated", "run": "r", "engine": "suite", "row": r,
                          "step": 0, "metric": m, "value": v} for a, r, m, v in rows])


def test_compare_ratios_and_status():
    paper = load_paper_numbers()
    tidy = _tidy([("fig5", "cp=2", "speedup_vs_best_usp", 3.19), ("fig5", "cp=4", "speedup_vs_best_usp", 1.15),
                  ("fig7", "pp=4", "speedup_vs_host_staging", 6.0), ("fig7", "pp=4", "write_bandwidth_gbps", 5.0)])
    prof = load_profile("cpu-tiny")
    paper_hw = {"H100": {"matmul_tflops": {"float32": 67.0}, "copy_bw_gbps": 3350.0, "p2p_bw_gbps": 450.0}}
    f5 = compare_artifact("fig5", tidy, paper, prof, {"matmul_tflops": 0.1}, paper_hw).set_index(["row", "metric"])
    assert f5.loc[("cp=2", "speedup_vs_best_usp"), "ratio"] == pytest.approx(3.19 / 2.9)
    assert f5.loc[("cp=2", "speedup_vs_best_usp"), "status"] == "meets or beats paper"
    assert f5.loc[("cp=4", "speedup_vs_best_usp"), "status"] == "short of paper"
    near = compare_artifact("fig5", _tidy([("fig5", "cp=2", "speedup_vs_best_usp", 2.8)]), paper, prof, None,
                            paper_hw).set_index(["row", "metric"])
    assert near.loc[("cp=2", "speedup_vs_best_usp"), "status"] == "within 10% of paper"
    assert f5.loc[("cp=8", "speedup_vs_best_usp"), "status"] == "no measurement yet"
    f7 = compare_artifact("fig7", tidy, paper, prof, None, paper_hw).set_index(["row", "metric"])
    assert f7.loc[("pp=4", "speedup_vs_host_staging"), "status"] == "within paper range"
    assert f7.loc[("pp=4", "speedup_vs_host_staging"), "paper_value"] == "4.5-8.5"
    assert f7.loc[("pp=4", "write_bandwidth_gbps"), "status"] == "below paper range"


def test_expected_ratio_from_ceilings():
    paper_hw = {"H100": {"matmul_tflops": {"bfloat16": 989.0}, "copy_bw_gbps": 3350.0, "p2p_bw_gbps": 450.0}}
    paper_scale = {**load_profile("paper-h100")}
    time_number = {"scales_with": "flops", "paper_hardware": "8x H100", "higher_is_better": False}
    exp, why = expected_ratio(time_number, paper_scale, {"matmul_tflops": 494.5}, paper_hw)
    assert exp == pytest.approx(2.0) and why == ""   # half the FLOP/s: a time twice the paper's
    bw_number = {"scales_with": "p2p_bw", "paper_hardware": "H100", "higher_is_better": True}
    assert expected_ratio(bw_number, paper_scale, {"p2p_bw_gbps": 900.0}, paper_hw)[0] == pytest.approx(2.0)
    exp, why = expected_ratio(time_number, load_profile("cpu-tiny"), {"matmul_tflops": 0.1}, paper_hw)
    assert exp is None and why == "scaled workload"
    assert expected_ratio({"scales_with": "none"}, paper_scale, None, paper_hw) == (1.0, "")


def test_reports_say_which_artifacts_have_no_measurement(tmp_path):
    tidy = _tidy([("fig5", "cp=2", "speedup_vs_best_usp", 3.0)])
    write_reports("cpu-tiny", tidy, None, tmp_path)
    index = (tmp_path / "index.md").read_text()
    assert "| fig5 | 6 | 1 | 1 | measured |" in index
    assert "| table1 | 23 | 0 | 0 | no measurement yet |" in index
    assert "No measurement yet for table2" in (tmp_path / "table2.md").read_text()


def test_index_tells_unmatched_measurements_apart(tmp_path):
    tidy = _tidy([("fig6", "ttt 4K cp=1", "time_s", 0.5)])
    write_reports("cpu-tiny", tidy, None, tmp_path)
    assert "| fig6 | 8 | 0 | 1 | measured, but no row matches a paper number at this scale |" in (
        tmp_path / "index.md").read_text()


def test_table_rows_trained_in_lockstep_say_so():
    from repro.report.artifacts.table1 import METRICS, comparison_table
    paper = load_paper_numbers()
    tidy = _tidy([("table1", "Qwen3-8B/DFlash", "acceptance_length", 3.4),
                  ("table1", "Qwen3-8B/DFlash", "lockstep_rows", 4.0),
                  ("table1", "Qwen3-8B/DSpark", "acceptance_length", 3.5)])
    df = comparison_table(tidy, paper[paper["artifact"] == "table1"], METRICS, ["Qwen3-8B/DFlash", "Qwen3-8B/DSpark"])
    on = dict(zip(df["row"], df["measured on"]))
    assert on == {"Qwen3-8B/DFlash": "cpu-2c (cpu-emulated), lockstep", "Qwen3-8B/DSpark": "cpu-2c (cpu-emulated)"}


def test_a_reference_run_of_this_machines_tag_keeps_its_own_values():
    """This machine and a committed reference machine of the same tag (one machine type): every table gives each
    its own numbers under its own label, never one's value on both lines."""
    from repro.report.artifacts.decode import decode_rows, summary_table
    from repro.report.artifacts.table1 import METRICS, comparison_table
    paper = load_paper_numbers()
    here, ref = (_tidy([("table1", "Qwen3-8B/DFlash", "rollout_speedup", v), ("decode", "suite-all/plain/b1",
                                                                             "ms_per_step", v)]) for v in (1.1, 1.5))
    here["hardware_label"], ref["hardware_label"], ref["run"] = "cpu-emulated, this machine", \
        "cpu-emulated, reference", "reference/cpu-2c/cpu-tiny/r"
    tidy = pd.concat([ref, here], ignore_index=True)
    t1 = comparison_table(tidy, paper[paper["artifact"] == "table1"], METRICS, ["Qwen3-8B/DFlash"])
    assert dict(zip(t1["measured on"], t1["rollout (ours)"])) == {
        "cpu-2c (cpu-emulated, reference)": 1.5, "cpu-2c (cpu-emulated, this machine)": 1.1}
    cmp = compare_artifact("table1", tidy, paper, load_profile("cpu-tiny"), None, {})
    got = cmp[(cmp["row"] == "Qwen3-8B/DFlash") & (cmp["metric"] == "rollout_speedup")]
    assert dict(zip(got["measured_hardware"], got["measured_value"])) == {
        "cpu-2c (cpu-emulated, reference)": 1.5, "cpu-2c (cpu-emulated, this machine)": 1.1}
    assert standing({"table1": cmp}, "cpu-2c")["measured here"].tolist() == [1]    # the reference is not here
    dec = summary_table(decode_rows(tidy[tidy["artifact"] == "decode"]))
    assert dict(zip(dec["hardware"], dec["ms_per_step"])) == {
        "cpu-2c (cpu-emulated, reference)": 1.5, "cpu-2c (cpu-emulated, this machine)": 1.1}
