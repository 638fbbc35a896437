"""The baseline's seed-to-seed spread in Figures 3-4, and whether each co-trained curve stays inside it.

A profile's ``fig3:``/``fig4:`` section may ask for ``baseline_seeds: [1, 2]``: the workflow then runs the
baseline (no-draft) row again with each of those *sampling* seeds, into ``<row folder>_sampling<k>``
(``replica_run_name``): the main run's prompts, held-out split and SFT warm start, only the random numbers of its
rollouts and draft anchors from seed k. That is exactly how a co-trained row differs from its baseline (speculative
sampling is lossless but draws its own random numbers), so the band is the spread the null hypothesis
("co-training does not change the policy's learning") predicts. Whole-seed replicas (``<row folder>_seed<k>``,
other prompts too) are banded only where no sampling replicas exist, and the table says which kind it used.
Replicas log under the baseline's row label and are recognised by their run folder name (``replica_of_run``).

The band, the fractions, the verdict, the self-check and the acceptance-length trend are defined in
docs/metrics.md.

    python -m repro.report.seed_spread results/tidy/cpu-tiny/fig3.csv     # print the verdict table
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPLICA_SUFFIX = re.compile(r"_(seed|sampling)(\d+)$")
SAMPLING, FULL = "sampling", "seed"       # replica kinds, as their folder suffixes spell them
SMOOTH = {"train/reward": 4, "val/accuracy": 1}
BAND_METRICS = (("train/reward", "reward"), ("val/accuracy", "val accuracy"))
K_SD = 2.0
MIN_FRACTION = 0.5
TOL = 1e-12
WITHIN, OUTSIDE = "within the seed-to-seed spread", "outside"
ACCEPTANCE = "train/acceptance_length"
SLOPE_RESAMPLES = 2000
RISES, FALLS, UNRESOLVED = "yes", "falls", "not resolved"
TABLE_COLUMNS = ["row", "baseline", "baseline runs", "replicas", "reward in band", "val accuracy in band", "verdict",
                 "out of band: above/below", "run means [baseline runs]", "acceptance slope/step", "slope 95% CI",
                 "acceptance rises", "measured on"]


def replica_of_run(run: str) -> tuple[str, int] | None:
    """(kind, seed) of a replica run (folder ending in ``_sampling<k>`` or ``_seed<k>``); None for a main run."""
    m = REPLICA_SUFFIX.search(str(run).rstrip("/"))
    return (m.group(1), int(m.group(2))) if m else None


def seed_of_run(run: str) -> int | None:
    """The seed of a replica run; None for a row's main run."""
    rep = replica_of_run(run)
    return rep[1] if rep else None


def main_runs(steps: pd.DataFrame) -> pd.DataFrame:
    """The per-step rows of every row's main run (replicas left out)."""
    return steps[[seed_of_run(r) is None for r in steps["run"]]]


def baseline_row(steps: pd.DataFrame) -> str | None:
    """The row that has replicas (None when there are none); more than one is an error."""
    rows = sorted({r for r, run in zip(steps["row"], steps["run"]) if seed_of_run(run) is not None})
    if len(rows) > 1:
        raise ValueError(f"seed replicas of several rows {rows}; expected those of the one baseline row")
    return rows[0] if rows else None


def banded_runs(steps: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """``steps`` without the replicas that are not banded (whole-seed ones where sampling ones exist), and a
    description of the replicas kept, e.g. "sampling seeds 1, 2"."""
    reps = {run: replica_of_run(run) for run in set(steps["run"]) if replica_of_run(run)}
    kind = SAMPLING if any(k == SAMPLING for k, _ in reps.values()) else FULL
    drop = {run for run, (k, _) in reps.items() if k != kind}
    seeds = ", ".join(str(s) for s in sorted(s for k, s in reps.values() if k == kind))
    what = f"sampling seeds {seeds}" if kind == SAMPLING else f"whole seeds {seeds} (other prompts too)"
    return steps[~steps["run"].isin(drop)], what


def smooth(curve: pd.Series, window: int) -> pd.Series:
    """Trailing mean over the last ``window`` logged points of a step-indexed curve."""
    if window < 1:
        raise ValueError(f"smoothing window {window}: expected an integer >= 1")
    return curve.sort_index().rolling(window, min_periods=1).mean()


def logged(steps: pd.DataFrame, run: str, metric: str) -> pd.Series:
    """One run's logged values of ``metric``, indexed by step (a re-logged step: the last value)."""
    return steps[(steps["run"] == run) & (steps["metric"] == metric)].groupby("step")["value"].last()


def curve(steps: pd.DataFrame, run: str, metric: str) -> pd.Series:
    """One run's smoothed values of ``metric``, indexed by step."""
    return smooth(logged(steps, run, metric), SMOOTH.get(metric, 1))


def band(steps: pd.DataFrame, row: str, metric: str) -> pd.DataFrame:
    """Per step: the baseline runs' mean, sd, lo = mean - K_SD sd, hi = mean + K_SD sd, and run count."""
    runs = sorted(set(steps.loc[steps["row"] == row, "run"]))
    curves = [c for c in (curve(steps, r, metric) for r in runs) if len(c)]
    if len(curves) < 2:
        raise ValueError(f"row {row!r}, {metric}: {len(curves)} run(s) logged it; a seed band needs >= 2 "
                         "(the main run plus baseline_seeds replicas)")
    wide = pd.concat(curves, axis=1, join="inner")
    mean, sd = wide.mean(axis=1), wide.std(axis=1, ddof=1)
    return pd.DataFrame({"step": wide.index, "mean": mean.values, "sd": sd.values, "lo": (mean - K_SD * sd).values,
                         "hi": (mean + K_SD * sd).values, "runs": len(curves)})


def run_mean(steps: pd.DataFrame, run: str, metric: str, on_steps) -> float:
    """Mean of ``run``'s logged (unsmoothed) ``metric`` over the steps ``on_steps``; NaN when it logged none."""
    d = logged(steps, run, metric)
    d = d[d.index.isin(list(on_steps))]
    return float(d.mean()) if len(d) else float("nan")


def means_cell(steps: pd.DataFrame, run: str, base_runs: list[str], bands: dict[str, pd.DataFrame]) -> str:
    """``run``'s mean per band metric over the band's steps, beside the range of the baseline runs' means: a whole
    run's level, where the per-step band judges each step (a metric that moves in whole held-out prompts can leave a
    zero-width band by one prompt at a step and still sit among the baseline runs on average)."""
    parts = []
    for metric, name in BAND_METRICS:
        on = bands[metric]["step"]
        base = [run_mean(steps, r, metric, on) for r in base_runs]
        parts.append(f"{name.split()[0]} {run_mean(steps, run, metric, on):.3g} [{min(base):.3g}, {max(base):.3g}]")
    return "; ".join(parts)


def band_position(values: pd.Series, b: pd.DataFrame) -> tuple[int, int, int]:
    """(steps of ``values`` inside the band, above it, below it), over the band steps ``values`` logged."""
    bb = b.set_index("step")
    common = [s for s in values.index if s in bb.index]
    above = sum(bool(values[s] > bb.at[s, "hi"] + TOL) for s in common)
    below = sum(bool(values[s] < bb.at[s, "lo"] - TOL) for s in common)
    return len(common) - above - below, above, below


def slope_interval(x, y, resamples: int = SLOPE_RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """(slope, low, high): the least-squares slope of ``y`` against ``x`` and its 95% percentile bootstrap interval
    over resampled (x, y) pairs; NaNs with fewer than 3 points."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3:
        return float("nan"), float("nan"), float("nan")
    slope = float(np.polyfit(x, y, 1)[0])
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    xs, ys = x[idx], y[idx]
    xc = xs - xs.mean(axis=1, keepdims=True)
    var = (xc ** 2).sum(axis=1)
    ok = var > 0                          # a resample of one repeated point has no slope
    boot = (xc * (ys - ys.mean(axis=1, keepdims=True))).sum(axis=1)[ok] / var[ok]
    low, high = np.percentile(boot, [2.5, 97.5])
    return slope, float(low), float(high)


def acceptance_trend(steps: pd.DataFrame, run: str) -> tuple[float, float, float]:
    """``slope_interval`` of ``run``'s acceptance length against step (per step)."""
    s = logged(steps, run, ACCEPTANCE)
    return slope_interval(s.index.to_numpy(float), s.to_numpy(float))


def trend_word(low: float, high: float) -> str:
    if np.isnan(low):
        return "-"
    return RISES if low > 0 else FALLS if high < 0 else UNRESOLVED


def judge(h: pd.DataFrame, run: str, bands: dict[str, pd.DataFrame], row: str, baseline: str, base_runs: list[str],
          replicas: str) -> dict:
    """One verdict line: ``run``'s smoothed curves against ``bands`` (made of the ``base_runs``), its run means
    beside theirs, and its acceptance trend."""
    hw, label = h["hardware"].iloc[0], h["hardware_label"].iloc[0]
    line = {"row": row, "baseline": baseline, "baseline runs": len(base_runs), "replicas": replicas}
    ok, sides = True, []
    for metric, name in BAND_METRICS:
        n_in, above, below = band_position(curve(h, run, metric), bands[metric])
        n = n_in + above + below
        frac = n_in / n if n else float("nan")
        ok = ok and n > 0 and frac >= MIN_FRACTION
        line[f"{name} in band"] = f"{n_in}/{n} ({frac:.2f})" if n else "-"
        sides.append(f"{name.split()[0]} {above}/{below}")
    slope, low, high = acceptance_trend(h, run)
    line.update({"verdict": WITHIN if ok else OUTSIDE, "out of band: above/below": ", ".join(sides),
                 "run means [baseline runs]": means_cell(h, run, base_runs, bands),
                 "acceptance slope/step": slope,
                 "slope 95% CI": "-" if np.isnan(low) else f"[{low:.3g}, {high:.3g}]",
                 "acceptance rises": trend_word(low, high),
                 "measured on": f"{hw} ({label})" if label else hw})
    return line


def baseline_groups(steps: pd.DataFrame):
    """(hardware, its steps less the replicas not banded, baseline row, replicas description) for every hardware
    whose runs include replicas (``banded_runs``); the loop that the verdict and self-check tables share."""
    for (hw, _), h in steps.groupby(["hardware", "hardware_label"], sort=True):   # a reference of this tag apart
        base = baseline_row(h)
        if base is not None:
            banded, replicas = banded_runs(h)
            yield hw, banded, base, replicas


def spread_table(steps: pd.DataFrame) -> pd.DataFrame:
    """One line per co-trained row (per hardware): fraction of its steps in the baseline's band, verdict,
    acceptance trend. Empty when no row has seed replicas."""
    lines = []
    for hw, h, base, replicas in baseline_groups(steps):
        bands = {m: band(h, base, m) for m, _ in BAND_METRICS}
        base_runs = sorted(set(h.loc[h["row"] == base, "run"]))
        mains = main_runs(h)
        for row in sorted(set(mains["row"]) - {base}):
            runs = sorted(set(mains.loc[mains["row"] == row, "run"]))
            if len(runs) != 1:
                raise ValueError(f"row {row!r} on {hw}: {len(runs)} main runs {runs}; expected one")
            lines.append(judge(h, runs[0], bands, row, base, base_runs, replicas))
    return pd.DataFrame(lines, columns=TABLE_COLUMNS)


def self_check_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Each baseline run judged like a co-trained row against the band of the *other* baseline runs (with >= 3
    baseline runs): how often the test calls a run of the baseline itself outside. Empty otherwise."""
    lines = []
    for _, h, base, replicas in baseline_groups(steps):
        runs = sorted(set(h.loc[h["row"] == base, "run"]))
        if len(runs) < 3:
            continue
        for run in runs:
            others = h[~((h["row"] == base) & (h["run"] == run))]
            bands = {m: band(others, base, m) for m, _ in BAND_METRICS}
            rep = replica_of_run(run)
            name = "main run" if rep is None else f"{'sampling seed' if rep[0] == SAMPLING else 'seed'} {rep[1]}"
            lines.append(judge(h, run, bands, f"{base} ({name})", f"the other {base} runs",
                               [r for r in runs if r != run], replicas))
    return pd.DataFrame(lines, columns=TABLE_COLUMNS)


NOTES = [f"Seed band: per step, mean +- {K_SD:g} sd (ddof=1) over the baseline row's runs (main run + "
         "baseline_seeds replicas; column 'replicas': sampling seeds keep the main run's prompts, held-out split "
         "and SFT warm start and change only the random numbers of sampling, as co-training does; whole seeds, "
         "an older kind of replica, also draw other prompts, so a row sharing the main run's prompts "
         "sits where those prompts put it) "
         f"of the curve smoothed by a trailing mean over {SMOOTH['train/reward']} logged steps for reward and "
         f"{SMOOTH['val/accuracy']} for validation accuracy (the figure's reward panel shows the same smoothing). "
         f"Verdict: '{WITHIN}' when at least {MIN_FRACTION:.0%} of a co-trained row's band steps lie inside for "
         "both reward and validation accuracy, else 'outside'. Out of band: the steps above and below the band, "
         "per metric (above: a higher reward or accuracy than the baseline's spread). Run means: the row's mean "
         "reward and validation accuracy over the band's steps (unsmoothed), and in brackets the lowest and highest "
         "of the baseline runs' means (descriptive: a run exchangeable with n baseline runs falls outside their range "
         "with probability 2/(n+1), one half for n = 3). Acceptance slope: "
         "least-squares slope of acceptance length against step over every logged step, with a 95% bootstrap "
         f"interval over the steps; rises '{RISES}' when the interval lies above 0, '{FALLS}' when below, "
         f"'{UNRESOLVED}' when it spans 0.",
         "Lines '<baseline> (main run)' and '<baseline> (seed k)' (with >= 3 baseline runs): that baseline run judged "
         "the same way against the band of the other baseline runs, i.e. how often this test calls the baseline "
         "itself outside; an 'outside' of a co-trained row weighs only as much as the baseline's own lines allow."]


def main(argv: list[str] | None = None) -> int:
    from repro.report.collect import read_tidy
    from repro.report.tables import to_markdown
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m repro.report.seed_spread <tidy csv>", file=sys.stderr)
        return 2
    tidy = read_tidy(Path(args[0]))
    steps = tidy[tidy["metric"].str.startswith(("train/", "val/"))]
    print(to_markdown(pd.concat([spread_table(steps), self_check_table(steps)], ignore_index=True), notes=NOTES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
