"""Summary rows and the Table 1/2, Figure 3/4 builders on synthetic run folders and tidy tables
(numbers chosen so every summary value can be checked by hand).

    .venv/bin/python -m pytest -q tests/rl/test_summary.py
"""
import json

import pandas as pd
import pytest

from repro.core.layout import run_dir_name
from repro.report.artifacts import fig3, table1
from repro.report.paper import load_paper_numbers
from repro.rl.summary import summarize


def _write_run(root, row, steps):
    d = root / run_dir_name(row)
    d.mkdir(parents=True)
    with open(d / "metrics.jsonl", "w") as f:
        for s in steps:
            f.write(json.dumps({"row": row, **s}) + "\n")


def _steps(n, rollout, update, tokens, al=None, cpu=None):
    out = []
    for i in range(n):
        s = {"step": i, "train/rollout_time_s": rollout, "train/update_time_s": update,
             "train/step_time_s": rollout + update, "train/gen_tokens": tokens, "train/reward": 0.5,
             "train/train_inference_kl": 1e-7}
        if cpu is not None:     # (rollout, update) CPU seconds
            s.update({"train/rollout_cpu_s": cpu[0], "train/update_cpu_s": cpu[1], "train/step_cpu_s": sum(cpu)})
        if al is not None:
            s["train/acceptance_length"] = al + i
        out.append(s)
    return out


def test_table2_summary_by_hand(tmp_path):
    rows = {"no draft": {"policy": "dense"}, "DFlash": {"policy": "dense", "draft": "dflash", "baseline": "no draft"}}
    _write_run(tmp_path, "no draft", _steps(13, rollout=4.0, update=1.0, tokens=100))
    steps = _steps(13, rollout=2.0, update=1.25, tokens=100, al=2.0)
    crashed = {**steps[1], "train/rollout_time_s": 99.0}        # logged, then the run crashed and resumed:
    _write_run(tmp_path, "DFlash", [steps[0], crashed] + steps[1:])   # the re-logged (later) step 1 wins
    s = summarize("table2", rows, tmp_path, skip_steps=1)
    d = s["DFlash"]
    assert d["rollout_speedup"] == pytest.approx(2.0)
    assert d["rollout_time_s"] == pytest.approx(2.0)
    assert d["update_overhead_pct"] == pytest.approx(25.0)
    assert d["e2e_speedup"] == pytest.approx(5.0 / 3.25)
    assert d["e2e_speedup_free_draft_update"] == pytest.approx(5.0 / 3.0)    # its update at the no-draft 1.0 s
    # first 10 updates after the skipped warm-up step: AL = 2 + (1..10) -> mean 7.5
    assert d["acceptance_length"] == pytest.approx(7.5)
    assert s["no draft"]["rollout_speedup"] == 1.0 and s["no draft"]["rollout_share_of_step_pct"] == pytest.approx(80)
    assert "tap_wait_s" not in d                                # no PP probe in this run


def test_tap_wait_comes_from_the_pp_probe_rows(tmp_path):
    rows = {"no draft": {}, "DSpark": {"draft": "dspark", "baseline": "no draft"}}
    _write_run(tmp_path, "no draft", _steps(3, rollout=2.0, update=1.0, tokens=10))
    probe = [{"step": 3 + i, "pp/tap_wait_s": w, "pp/update_time_s": 2.0} for i, w in enumerate((0.1, 0.3))]
    _write_run(tmp_path, "DSpark", _steps(3, rollout=1.0, update=1.0, tokens=10, al=2.0) + probe)
    d = summarize("table2", rows, tmp_path)["DSpark"]
    assert d["tap_wait_s"] == pytest.approx(0.2) and d["pp_update_time_s"] == 2.0
    assert d["acceptance_length"] == pytest.approx(3.0)         # probe rows are not training steps


def test_table1_summary_normalises_per_token(tmp_path):
    rows = {"A/no draft": {}, "A/DSpark": {"draft": "dspark", "baseline": "A/no draft"}}
    _write_run(tmp_path, "A/no draft", _steps(4, rollout=4.0, update=1.0, tokens=100, cpu=(2.0, 1.0)))
    _write_run(tmp_path, "A/DSpark", _steps(4, rollout=4.0, update=1.0, tokens=300, al=3.0, cpu=(3.0, 1.0)))
    s = summarize("table1", rows, tmp_path)
    assert s["A/DSpark"]["rollout_speedup"] == pytest.approx(3.0)     # 3x the tokens in the same time
    c = summarize("table1", rows, tmp_path, basis="cpu")["A/DSpark"]
    assert c["rollout_speedup"] == pytest.approx(2.0) and c["rollout_speedup_wall"] == pytest.approx(3.0)
    assert c["e2e_speedup"] == pytest.approx(3.0 * 3 / 4)
    assert c["e2e_speedup_free_draft_update"] == pytest.approx(c["e2e_speedup"])    # the same update time
    with pytest.raises(FileNotFoundError, match="metrics.jsonl: missing"):
        summarize("table1", {"B/x": {}}, tmp_path)
    with pytest.raises(ValueError, match="no steps left"):
        summarize("table1", rows, tmp_path, skip_steps=4)


def _tidy(rows):
    base = {"artifact": "table1", "profile": "cpu-tiny", "hardware": "cpu-2c", "hardware_label": "cpu-emulated",
            "engine": "suite"}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_table1_builder_lists_every_paper_row(tmp_path):
    tidy = _tidy([{"run": "s", "row": "Qwen3-8B/DFlash", "step": 0, "metric": m, "value": v}
                  for m, v in (("acceptance_length", 2.5), ("rollout_speedup", 1.4), ("e2e_speedup", 1.2))])
    paper = load_paper_numbers()
    table1.build(tidy, paper[paper["artifact"] == "table1"], tmp_path)
    df = pd.read_csv(tmp_path / "table1.csv")
    assert len(df) == 7
    r = df[df["row"] == "Qwen3-8B/DFlash"].iloc[0]
    assert (r["AL (ours)"], r["rollout (ours)"], r["E2E (paper)"]) == (2.5, 1.4, 1.88)
    assert df[df["row"] == "GPT-OSS-120B/DFlash"]["AL (ours)"].isna().all()


def test_fig3_builder_draws_curves_and_summary(tmp_path):
    rows = []
    for run, row in (("a", "no draft"), ("b", "DFlash")):
        for step in range(3):
            rows.append({"run": run, "row": row, "step": step, "metric": "train/reward", "value": 0.1 * step})
            rows.append({"run": run, "row": row, "step": step, "metric": "train/train_inference_kl", "value": 1e-7})
    rows.append({"run": "s", "row": "all", "step": 0, "metric": "train_inference_kl", "value": 1e-7})
    paper = load_paper_numbers()
    paths = fig3.build(_tidy(rows), paper[paper["artifact"] == "fig3"], tmp_path)
    assert {p.suffix for p in paths} == {".pdf", ".png", ".csv", ".md"}
    md = (tmp_path / "fig3.md").read_text()
    assert "train_inference_kl" in md and "0.0006-0.0007" in md


def test_lockstep_rows_come_from_the_run_record(tmp_path):
    rows = {"no draft": {}, "DFlash": {"draft": "dflash", "baseline": "no draft"}}
    _write_run(tmp_path, "no draft", _steps(3, rollout=2.0, update=1.0, tokens=10))
    _write_run(tmp_path, "DFlash", _steps(3, rollout=1.0, update=1.0, tokens=10, al=2.0))
    (tmp_path / run_dir_name("DFlash") / "run.json").write_text(json.dumps({"lockstep_rows": ["no draft", "DFlash"]}))
    s = summarize("table1", rows, tmp_path)
    assert s["DFlash"]["lockstep_rows"] == 2.0 and "lockstep_rows" not in s["no draft"]


def test_summary_carries_the_runs_hardware(tmp_path, monkeypatch):
    from repro.rl import summary
    monkeypatch.setenv("WANDB_MODE", "disabled")
    gpu = {"tag": "1xh200", "label": "gpu"}
    for row, al in (("no draft", None), ("EAGLE-3", 2.0), ("DFlash", 3.0), ("DSpark", 3.0)):
        _write_run(tmp_path, row, _steps(3, rollout=1.0, update=1.0, tokens=10, al=al))
        (tmp_path / run_dir_name(row) / "env.json").write_text(json.dumps({"hardware": gpu}))
    args = ["--artifact", "table2", "--profile", "h200", "--runs", str(tmp_path)]
    assert summary.main(args) == 0
    env = json.loads((tmp_path / "summary" / "env.json").read_text())
    assert env["hardware"] == gpu and env["derived_on"]["tag"] != "1xh200"
    (tmp_path / run_dir_name("EAGLE-3") / "env.json").write_text(json.dumps({"hardware": {"tag": "cpu-2c"}}))
    assert summary.main(args) == 2


def test_overhead_interval_pairs_lockstep_steps(tmp_path):
    """The update overhead's bootstrap interval: a point when every step has the same ratio and the steps pair up
    (lockstep rows share each step's time window, so host drift cancels); wide when they cannot pair; seeded."""
    from repro.rl.summary import overhead_interval_pct
    drift = [1.0, 1.6, 0.9, 1.3, 1.1, 1.5]                      # the host's speed, step to step
    assert overhead_interval_pct(drift, [1.1 * x for x in drift]) == pytest.approx((10.0, 10.0))
    low, high = overhead_interval_pct(drift, [1.1 * x for x in drift[:5]])    # unpaired: drift shows
    assert low < 0 < 10 < high
    assert overhead_interval_pct(drift, drift[::-1]) == overhead_interval_pct(drift, drift[::-1])
    with pytest.raises(ValueError, match="level 1.5 is invalid"):
        overhead_interval_pct(drift, drift, level=1.5)
    rows = {"no draft": {}, "DFlash": {"draft": "dflash", "baseline": "no draft"}}
    _write_run(tmp_path, "no draft", [{**s, "train/update_time_s": u}
                                      for s, u in zip(_steps(6, 2.0, 1.0, 10), drift)])
    _write_run(tmp_path, "DFlash", [{**s, "train/update_time_s": u * (1.2 if i % 2 else 1.0)}
                                    for i, (s, u) in enumerate(zip(_steps(6, 1.0, 1.0, 10, al=2.0), drift))])
    d = summarize("table1", rows, tmp_path)["DFlash"]
    assert d["update_overhead_ci95_low_pct"] <= d["update_overhead_pct"] <= d["update_overhead_ci95_high_pct"]
    assert 0 <= d["update_overhead_ci95_low_pct"] < d["update_overhead_ci95_high_pct"] <= 20
    assert "update_overhead_ci95_low_pct" not in summarize("table1", rows, tmp_path)["no draft"]


def test_repeats_pool_the_steps_of_the_same_rows_run_again(tmp_path):
    """A repeat of the same configuration adds its steps (each run's warm-up skipped on its own); the final AL is
    each run's own last three steps, averaged; a repeat of another configuration is refused, naming the entry."""
    rows = {"no draft": {}, "DFlash": {"draft": "dflash", "baseline": "no draft"}}
    first, again = tmp_path / "first", tmp_path / "again"
    for root, slow in ((first, 1.0), (again, 3.0)):            # the second call's host ran the drafted update slower
        _write_run(root, "no draft", _steps(4, rollout=2.0, update=1.0, tokens=10))
        _write_run(root, "DFlash", _steps(4, rollout=1.0, update=slow, tokens=10, al=2.0))
        for row in rows:
            (root / run_dir_name(row) / "env.json").write_text(json.dumps(
                {"config": {"row": row, "steps": 4, "out": str(root), "grpo": {"lr": 2e-6}}}))
    alone = summarize("table1", rows, first, skip_steps=1)["DFlash"]
    pooled = summarize("table1", rows, first, skip_steps=1, repeats=[again])["DFlash"]
    assert alone["update_overhead_pct"] == pytest.approx(0.0) and "repeats" not in alone
    assert pooled["update_overhead_pct"] == pytest.approx(100.0)      # mean drafted update (1+3)/2 over 1
    assert pooled["repeats"] == 2.0
    assert pooled["acceptance_length"] == pytest.approx(4.0)           # AL 3, 4, 5 in each run
    assert pooled["acceptance_length_final"] == pytest.approx(4.0)
    (again / run_dir_name("DFlash") / "env.json").write_text(json.dumps(
        {"config": {"row": "DFlash", "steps": 4, "out": "elsewhere", "grpo": {"lr": 1e-6}}}))
    with pytest.raises(ValueError, match="config 'grpo' is"):
        summarize("table1", rows, first, repeats=[again])


def test_averaged_steps_that_compiled_are_counted(tmp_path):
    """train/compiled_graphs > 0 in a step the summary averages (after skip_steps): that step's time holds a
    compilation, and the row says how many such steps there were; the skipped warm-up's compilations do not count."""
    rows = {"no draft": {}, "DFlash": {"draft": "dflash", "baseline": "no draft"}}
    base = _steps(5, rollout=2.0, update=1.0, tokens=10)
    drafted = _steps(5, rollout=1.0, update=1.0, tokens=10, al=2.0)
    for i, s in enumerate(base):
        s["train/compiled_graphs"] = 7 if i == 0 else 0
    for i, s in enumerate(drafted):
        s["train/compiled_graphs"] = {0: 5, 3: 2}.get(i, 0)
    _write_run(tmp_path, "no draft", base)
    _write_run(tmp_path, "DFlash", drafted)
    s = summarize("table1", rows, tmp_path, skip_steps=1)
    assert s["no draft"]["averaged_steps_compiling"] == 0.0
    assert s["DFlash"]["averaged_steps_compiling"] == 1.0


def test_averaged_steps_that_captured_graphs_are_counted(tmp_path, capsys):
    """train/step_graph_captures > 0 in an averaged step: the row counts it, as it counts compilations; a run that
    logs no captures (no graphs) gets no count."""
    rows = {"no draft": {}, "DFlash": {"draft": "dflash", "baseline": "no draft"}}
    base = _steps(5, rollout=2.0, update=1.0, tokens=10)
    drafted = _steps(5, rollout=1.0, update=1.0, tokens=10, al=2.0)
    for i, s in enumerate(drafted):
        s["train/step_graph_captures"] = {0: 40, 2: 1, 4: 3}.get(i, 0)
    _write_run(tmp_path, "no draft", base)
    _write_run(tmp_path, "DFlash", drafted)
    s = summarize("table1", rows, tmp_path, skip_steps=1)
    assert "averaged_steps_capturing" not in s["no draft"]
    assert s["DFlash"]["averaged_steps_capturing"] == 2.0


def test_the_summary_warns_of_each_row_whose_averaged_steps_compiled_or_captured(tmp_path, capsys):
    """The command names each row whose averaged steps did warm-up work, how many and which metric to read."""
    from repro.rl.summary import main
    base = _steps(5, rollout=2.0, update=1.0, tokens=10, cpu=(2.0, 1.0))
    drafted = _steps(5, rollout=1.0, update=1.0, tokens=10, al=2.0, cpu=(1.0, 1.0))
    for i, s in enumerate(drafted):
        s["train/step_graph_captures"] = {0: 40, 2: 1, 4: 3}.get(i, 0)
        s["train/compiled_graphs"] = {3: 1}.get(i, 0)
    _write_run(tmp_path, "Qwen3-8B/no draft", base)
    _write_run(tmp_path, "Qwen3-8B/DFlash", drafted)
    assert main(["--artifact", "table1", "--runs", str(tmp_path), "--rows", "Qwen3-8B/no draft,Qwen3-8B/DFlash"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [
        "summary: warning: row 'Qwen3-8B/DFlash': 1 of the averaged steps compiled graphs (their times include the "
        "compilation; see train/compiled_graphs in its metrics.jsonl)",
        "summary: warning: row 'Qwen3-8B/DFlash': 2 of the averaged steps captured CUDA graphs (their times include "
        "the captures; see train/step_graph_captures in its metrics.jsonl)"]


def test_tables_name_the_rows_whose_averaged_steps_compiled(tmp_path):
    metrics = (("acceptance_length", 2.5), ("rollout_speedup", 1.4), ("e2e_speedup", 1.2))
    clean = _tidy([{"run": "s", "row": "Qwen3-8B/DFlash", "step": 0, "metric": m, "value": v} for m, v in metrics]
                  + [{"run": "s", "row": "Qwen3-8B/DFlash", "step": 0, "metric": "averaged_steps_compiling",
                      "value": 0.0}])
    paper = load_paper_numbers()
    table1.build(clean, paper[paper["artifact"] == "table1"], tmp_path / "clean")
    assert "Times include compilations" not in (tmp_path / "clean" / "table1.md").read_text()
    hit = pd.concat([clean, _tidy([{"run": "s", "row": "Qwen3-8B/no draft", "step": 0,
                                    "metric": "averaged_steps_compiling", "value": 2.0}])], ignore_index=True)
    table1.build(hit, paper[paper["artifact"] == "table1"], tmp_path / "hit")
    md = (tmp_path / "hit" / "table1.md").read_text()
    assert "Times include compilations" in md and "Qwen3-8B/no draft on cpu-2c (2)" in md
    assert "Qwen3-8B/DFlash on" not in md.split("Times include compilations")[1]
    assert "CUDA graph captures" not in md
    captured = pd.concat([hit, _tidy([{"run": "s", "row": "Qwen3-8B/DFlash", "step": 0,
                                       "metric": "averaged_steps_capturing", "value": 3.0}])], ignore_index=True)
    table1.build(captured, paper[paper["artifact"] == "table1"], tmp_path / "captured")
    md = (tmp_path / "captured" / "table1.md").read_text()
    assert "Times include compilations" in md
    assert "Times include CUDA graph captures" in md and "Qwen3-8B/DFlash on cpu-2c (3)" in md
