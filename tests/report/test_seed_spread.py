"""Seed band and verdicts of Figures 3-4 (repro.report.seed_spread) on synthetic tidy frames, and the
fig3 builder drawing the band and writing the verdict table.

    .venv/bin/python -m pytest -q tests/report/test_seed_spread.py
"""
import numpy as np
import pandas as pd
import pytest

from repro.core.layout import replica_run_name
from repro.report import seed_spread as ss

pytestmark = pytest.mark.timeout(120)
STEPS = list(range(12))


def _rows(run, row, metric, values, steps=STEPS, hw="cpu-2c"):
    return [{"artifact": "fig3", "profile": "cpu-tiny", "hardware": hw, "hardware_label": "cpu-emulated",
             "run": f"{hw}/cpu-tiny/fig3/{run}", "engine": "suite", "row": row, "step": s, "metric": metric,
             "value": float(v)} for s, v in zip(steps, values)]


def _frame(draft_reward, draft_val, draft_al=None, base_seeds=True):
    """Baseline rewards 0.4/0.5/0.6 (flat per seed) and val accuracy 0.2/0.3/0.4 every 4 steps."""
    rows = []
    runs = [("no_draft", 0.5, 0.3)] + ([("no_draft_sampling1", 0.4, 0.2), ("no_draft_sampling2", 0.6, 0.4)]
                                       if base_seeds else [])
    for run, r, v in runs:
        rows += _rows(run, "no draft", "train/reward", [r] * len(STEPS))
        rows += _rows(run, "no draft", "val/accuracy", [v] * 3, steps=[0, 4, 8])
    rows += _rows("dspark", "DSpark", "train/reward", draft_reward)
    rows += _rows("dspark", "DSpark", "val/accuracy", draft_val, steps=[0, 4, 8])
    rows += _rows("dspark", "DSpark", "train/acceptance_length",
                  draft_al if draft_al is not None else np.linspace(2.0, 3.0, len(STEPS)))
    return pd.DataFrame(rows)


def test_replica_run_names_round_trip_and_reject_bad_seeds():
    assert replica_run_name("no_draft", 2) == "no_draft_sampling2"
    assert ss.replica_of_run("cpu-2c/cpu-tiny/fig3/no_draft_sampling2") == ("sampling", 2)
    assert ss.replica_of_run("cpu-2c/cpu-tiny/fig3/no_draft_seed3") == ("seed", 3)       # the older replica naming
    assert ss.seed_of_run("cpu-2c/cpu-tiny/fig3/no_draft_seed2") == 2
    assert ss.seed_of_run("cpu-2c/cpu-tiny/fig3/no_draft") is None
    with pytest.raises(ValueError, match=r"baseline seed -1: expected an integer >= 0"):
        replica_run_name("no_draft", -1)


def test_sampling_replicas_are_banded_instead_of_whole_seed_ones():
    """Whole-seed replicas (other prompts) and sampling replicas of one baseline: only the sampling ones enter the
    band, and the table says which kind it used; without sampling replicas the whole-seed ones are banded."""
    f = _frame([0.5] * 12, [0.3] * 3)
    far = f[f["run"].str.endswith("no_draft_sampling1")].copy()       # a whole-seed replica far from the rest
    far["run"] = far["run"].str.replace("no_draft_sampling1", "no_draft_seed1")
    far["value"] = 5.0
    t = ss.spread_table(pd.concat([f, far])).set_index("row")
    assert t.at["DSpark", "replicas"] == "sampling seeds 1, 2"
    assert t.at["DSpark", "baseline runs"] == 3                         # main run + 2 sampling replicas, not 4
    kept, _ = ss.banded_runs(pd.concat([f, far]))
    assert not kept["run"].str.endswith("no_draft_seed1").any()
    whole = f.copy()
    whole["run"] = whole["run"].str.replace("_sampling", "_seed")
    t = ss.spread_table(whole).set_index("row")
    assert t.at["DSpark", "replicas"] == "whole seeds 1, 2 (other prompts too)"
    assert list(ss.self_check_table(whole)["row"]) == ["no draft (main run)", "no draft (seed 1)", "no draft (seed 2)"]


def test_band_is_mean_plus_minus_two_sd_over_the_baseline_runs():
    b = ss.band(_frame([0.5] * 12, [0.3] * 3), "no draft", "train/reward")
    assert b["runs"].iloc[0] == 3 and list(b["step"]) == STEPS
    # seeds 0.4/0.5/0.6: mean 0.5, sd 0.1 (ddof=1), band 0.3..0.7 (smoothing a flat curve keeps it flat)
    assert np.allclose(b["mean"], 0.5) and np.allclose(b["lo"], 0.3) and np.allclose(b["hi"], 0.7)
    v = ss.band(_frame([0.5] * 12, [0.3] * 3), "no draft", "val/accuracy")
    assert list(v["step"]) == [0, 4, 8] and np.allclose(v["lo"], 0.1) and np.allclose(v["hi"], 0.5)


def test_band_needs_two_baseline_runs():
    with pytest.raises(ValueError, match=r"'no draft'.*1 run\(s\).*needs >= 2"):
        ss.band(_frame([0.5] * 12, [0.3] * 3, base_seeds=False), "no draft", "train/reward")


def test_smoothing_is_a_trailing_mean_over_logged_points():
    s = ss.smooth(pd.Series([0.0, 1.0, 0.0, 1.0, 1.0], index=[0, 1, 2, 3, 4]), 4)
    assert np.allclose(s.to_numpy(), [0.0, 0.5, 1 / 3, 0.5, 0.75])


def test_verdict_within_for_a_baseline_like_row_and_outside_for_a_shifted_one():
    inside = ss.spread_table(_frame([0.55] * 12, [0.35] * 3))
    assert list(inside["row"]) == ["DSpark"] and inside["verdict"].iloc[0] == ss.WITHIN
    assert inside["reward in band"].iloc[0] == "12/12 (1.00)"
    # reward far above the band on every step: outside, even though validation accuracy is inside
    high = ss.spread_table(_frame([0.95] * 12, [0.35] * 3))
    assert high["verdict"].iloc[0] == ss.OUTSIDE and high["reward in band"].iloc[0] == "0/12 (0.00)"
    assert high["val accuracy in band"].iloc[0] == "3/3 (1.00)"
    # validation accuracy below the band at 2 of 3 points: outside (1/3 < MIN_FRACTION)
    low_val = ss.spread_table(_frame([0.5] * 12, [0.3, 0.0, 0.0]))
    assert low_val["verdict"].iloc[0] == ss.OUTSIDE and low_val["val accuracy in band"].iloc[0] == "1/3 (0.33)"
    # which side: every reward step above for the high row, two validation points below for the low one
    assert high["out of band: above/below"].iloc[0] == "reward 12/0, val 0/0"
    assert low_val["out of band: above/below"].iloc[0] == "reward 0/0, val 0/2"


def test_single_noisy_steps_are_smoothed_before_judging():
    # one step in four jumps to 1.0: raw values leave the 0.3..0.7 band 3 times; the 4-step trailing
    # mean (at most 0.5 + 0.5 / 4 = 0.625) stays inside on every step
    reward = [0.5, 0.5, 0.5, 1.0] * 3
    f = _frame(reward, [0.3] * 3)
    raw = pd.Series(reward, index=STEPS)
    assert ss.band_position(raw, ss.band(f, "no draft", "train/reward")) == (9, 3, 0)    # 9 in, 3 above, 0 below
    t = ss.spread_table(f)
    assert t["reward in band"].iloc[0] == "12/12 (1.00)" and t["verdict"].iloc[0] == ss.WITHIN


def test_acceptance_trend_is_the_least_squares_slope_with_an_interval():
    up = ss.spread_table(_frame([0.5] * 12, [0.3] * 3, draft_al=np.linspace(2.0, 3.1, 12)))
    assert up["acceptance slope/step"].iloc[0] == pytest.approx(0.1) and up["acceptance rises"].iloc[0] == "yes"
    assert up["slope 95% CI"].iloc[0] == "[0.1, 0.1]"                  # a straight line: every resample agrees
    down = ss.spread_table(_frame([0.5] * 12, [0.3] * 3, draft_al=np.linspace(3.0, 2.0, 12)))
    assert down["acceptance slope/step"].iloc[0] < 0 and down["acceptance rises"].iloc[0] == ss.FALLS
    noisy = ss.spread_table(_frame([0.5] * 12, [0.3] * 3, draft_al=[3.0, 2.0] * 6))   # slope < 0 by 1 step's noise
    assert noisy["acceptance slope/step"].iloc[0] < 0 and noisy["acceptance rises"].iloc[0] == ss.UNRESOLVED
    low, high = (float(v) for v in noisy["slope 95% CI"].iloc[0].strip("[]").split(","))
    assert low < 0 < high


def test_no_seed_replicas_gives_no_table_and_two_baselines_are_refused():
    assert ss.spread_table(_frame([0.5] * 12, [0.3] * 3, base_seeds=False)).empty
    f = _frame([0.5] * 12, [0.3] * 3)
    f = pd.concat([f, pd.DataFrame(_rows("dspark_seed1", "DSpark", "train/reward", [0.5] * 12))])
    with pytest.raises(ValueError, match=r"several rows \['DSpark', 'no draft'\]"):
        ss.spread_table(f)


def test_fig3_builder_draws_the_band_and_writes_the_verdicts(tmp_path):
    from repro.report.artifacts.fig3 import build
    tidy = _frame([0.95] * 12, [0.35] * 3)
    paper = pd.DataFrame(columns=["row", "metric", "stat", "value", "paper_hardware"])
    paths = build(tidy, paper, tmp_path)
    spread = pd.read_csv(tmp_path / "fig3_spread.csv")
    assert list(spread["row"]) == ["DSpark", "no draft (main run)", "no draft (sampling seed 1)",
                                   "no draft (sampling seed 2)"]
    assert spread["verdict"].iloc[0] == ss.OUTSIDE
    md = (tmp_path / "fig3.md").read_text()
    assert "seed-to-seed spread" in md and "| DSpark | no draft | 3 |" in md
    assert tmp_path / "fig3.png" in paths


def test_self_check_judges_each_baseline_run_against_the_others():
    # baseline rewards 0.4/0.5/0.6 (val 0.2/0.3/0.4). Leaving out 0.5: the others give mean 0.5, sd 0.141, band
    # 0.217..0.783: inside. Leaving out 0.4: 0.5/0.6 give 0.55 +- 2 * 0.0707 = 0.409..0.691: 0.4 is outside (and
    # 0.6 likewise against 0.4/0.5): with three runs the test calls the baseline's own extremes outside
    t = ss.self_check_table(_frame([0.5] * 12, [0.3] * 3)).set_index("row")
    assert list(t.index) == ["no draft (main run)", "no draft (sampling seed 1)", "no draft (sampling seed 2)"]
    assert set(t["baseline runs"]) == {2} and set(t["acceptance rises"]) == {"-"}
    assert t.at["no draft (main run)", "verdict"] == ss.WITHIN
    assert t.at["no draft (main run)", "reward in band"] == "12/12 (1.00)"
    assert (t.at["no draft (sampling seed 1)", "verdict"] == t.at["no draft (sampling seed 2)", "verdict"]
            == ss.OUTSIDE)
    assert t.at["no draft (sampling seed 1)", "reward in band"] == "0/12 (0.00)"
    # fewer than 3 baseline runs: a leave-one-out band would rest on one run, so no self-check
    two = _frame([0.5] * 12, [0.3] * 3)
    two = two[~two["run"].str.endswith("no_draft_sampling2")]
    assert ss.self_check_table(two).empty


def test_run_means_sit_beside_the_baseline_runs_range():
    """The descriptive column: a row's mean over the band's steps and the baseline runs' lowest and highest means;
    in the self-check, the range is over the other baseline runs only."""
    t = ss.spread_table(_frame([0.55] * 12, [0.35, 0.35, 0.05]))
    assert t["run means [baseline runs]"].iloc[0] == "reward 0.55 [0.4, 0.6]; val 0.25 [0.2, 0.4]"
    self_check = ss.self_check_table(_frame([0.5] * 12, [0.3] * 3)).set_index("row")
    assert self_check.at["no draft (main run)", "run means [baseline runs]"] == \
        "reward 0.5 [0.4, 0.6]; val 0.3 [0.2, 0.4]"
    assert self_check.at["no draft (sampling seed 1)", "run means [baseline runs]"] == \
        "reward 0.4 [0.5, 0.6]; val 0.2 [0.3, 0.4]"


def test_fig3_builder_keeps_each_machine_apart_and_draws_this_machines_runs(tmp_path, monkeypatch):
    """A reference machine listed first and this machine (CPU-time step rows, as cpu-emulated runs log): each
    machine's verdicts come from its own runs (the CPU basis keeps every run's machine), and the figure draws this
    machine's curves."""
    from repro.report.artifacts import fig3
    frames = []
    for hw, label, reward in (("cpu-2c-ref", "cpu-emulated, reference", 0.95), ("cpu-2c", "cpu-emulated, this machine",
                                                                              0.5)):
        f = _frame([reward] * 12, [0.3] * 3).assign(hardware=hw, hardware_label=label)
        f["run"] = f["run"].str.replace("cpu-2c/", f"{hw}/", regex=False)
        cpu = f[f["metric"] == "train/reward"].assign(metric="train/step_cpu_s", value=0.25)
        tok = cpu.assign(metric="train/gen_tokens", value=100.0)
        frames += [f, cpu, tok]
    tidy = pd.concat(frames, ignore_index=True)
    drawn = []
    real_main_runs = ss.main_runs
    monkeypatch.setattr(fig3.seed_spread, "main_runs", lambda steps: drawn.append(steps) or real_main_runs(steps))
    paper = pd.DataFrame(columns=["row", "metric", "stat", "value", "paper_hardware"])
    fig3.build(tidy, paper, tmp_path)
    spread = pd.read_csv(tmp_path / "fig3_spread.csv")
    dspark = spread[spread["row"] == "DSpark"].set_index("measured on")["verdict"].to_dict()
    assert dspark == {"cpu-2c-ref (cpu-emulated, reference)": ss.OUTSIDE,
                      "cpu-2c (cpu-emulated, this machine)": ss.WITHIN}
    curves = drawn[0]                               # the figure's curves: this machine's runs only, CPU basis
    assert set(curves["hardware"]) == {"cpu-2c"}
    st = curves[curves["metric"] == "train/throughput_tok_s"]
    assert len(st) and (st["value"] == 400.0).all() and set(st["hardware_label"]) == {"cpu-emulated, this machine"}
