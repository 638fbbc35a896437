"""Does co-training change how the policy learns? Run-level test of co-trained runs against no-draft runs.

Under the suite's claim (lossless speculative sampling; the draft's loss reaches the policy through no gradient,
``tests/rl/test_joint.py``) a co-trained run differs from a no-draft run of the same prompts only by the random
numbers of its sampling. So, over sampling seeds, the runs of a drafted row and of its baseline row are draws of one
distribution: *exchangeable*. This module tests that on whole runs. Per run it takes one number per metric: the
mean over all logged steps. Then an exact two-sided permutation test compares the mean of those numbers between the
two rows (``permutation_test``: every split of the pooled runs into the two group sizes, or a seeded Monte Carlo
sample when there are too many splits). The per-step band of ``repro.report.seed_spread`` asks where each step
lies; this asks whether the whole run's level differs, with a stated error rate.

    python -m repro.report.exchangeability --runs <folder of run folders> --baseline "no draft" --out <report folder>
    ... --runs fig3/no_draft --runs fig3/no_draft_sampling1 --runs <folder of new runs>     # runs from several places
    (scripts/experiments/exchangeability.sh runs the rows over sampling seeds, then this)

Writes ``report.json`` (per run: row, sampling seed, each metric's mean and per-step values; per drafted row and
metric: difference of means, p-value, the runs counted; provenance) and ``report.md``, both atomically.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np

from repro.report.provenance import provenance, write_atomic, write_json_atomic
from repro.rl.summary import read_steps

METRICS = ("train/reward", "val/accuracy", "train/acceptance_length")
TESTED = ("train/reward", "val/accuracy")      # the policy's learning; acceptance length is the draft's own
EXACT_LIMIT = 200_000                           # splits enumerated exactly up to this many, else Monte Carlo
MONTE_CARLO = 100_000


def permutation_test(a, b, *, seed: int = 0) -> tuple[float, float, str]:
    """(mean(a) - mean(b), two-sided p-value, method) of the permutation test of the difference of means.

    The p-value counts the splits of the pooled values into groups of len(a) and len(b) whose |difference| is at
    least the observed one (a 1e-12 relative tolerance keeps ties with the observed split). "exact" enumerates every
    split; "monte carlo" draws ``MONTE_CARLO`` random splits (seeded) and reports (hits + 1) / (draws + 1)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"permutation test needs >= 2 runs per group, got {len(a)} and {len(b)}")
    pooled, n = np.concatenate([a, b]), len(a)
    observed = a.mean() - b.mean()
    tol = 1e-12 * max(1.0, abs(observed))
    total = pooled.sum()

    def diff(idx) -> np.ndarray:                 # difference of means for the splits whose a-group is ``idx``
        s = pooled[idx].sum(axis=-1)
        return s / n - (total - s) / (len(pooled) - n)

    if math.comb(len(pooled), n) <= EXACT_LIMIT:
        idx = np.array(list(itertools.combinations(range(len(pooled)), n)))
        d = diff(idx)
        return float(observed), float(np.mean(np.abs(d) >= abs(observed) - tol)), "exact"
    rng = np.random.default_rng(seed)
    idx = np.argsort(rng.random((MONTE_CARLO, len(pooled))), axis=1)[:, :n]
    hits = int(np.sum(np.abs(diff(idx)) >= abs(observed) - tol))
    return float(observed), (hits + 1) / (MONTE_CARLO + 1), "monte carlo"


def read_run(run_dir: Path) -> dict:
    """One run folder as {run, row, sampling_seed, series: {metric: [[step, value], ...]}, mean: {metric: value}}."""
    env = json.loads((run_dir / "env.json").read_text())
    cfg = env.get("config") or {}
    steps = read_steps(run_dir)
    series = {m: [[int(s["step"]), float(s[m])] for s in steps if m in s] for m in METRICS}
    return {"run": run_dir.name, "row": cfg.get("row") or env.get("row"), "seed": cfg.get("seed"),
            "sampling_seed": cfg.get("sampling_seed") or 0, "steps": len(steps),
            "hardware": (env.get("hardware") or {}).get("tag"), "git_sha": (env.get("git") or {}).get("sha"),
            "series": {m: v for m, v in series.items() if v},
            "mean": {m: float(np.mean([x for _, x in v])) for m, v in series.items() if v}}


def compare(runs: list[dict], baseline: str) -> list[dict]:
    """Each drafted row's runs against the baseline row's, per tested metric."""
    rows = sorted({r["row"] for r in runs} - {baseline})
    base = [r for r in runs if r["row"] == baseline]
    if len(base) < 2:
        raise ValueError(f"baseline row {baseline!r}: {len(base)} run(s); the test needs >= 2 "
                         f"(rows found: {sorted({r['row'] for r in runs})})")
    out = []
    for row in rows:
        mine = [r for r in runs if r["row"] == row]
        for m in TESTED:
            a = [r["mean"][m] for r in mine if m in r["mean"]]
            b = [r["mean"][m] for r in base if m in r["mean"]]
            if not a or not b:
                continue
            if len(a) < 2 or len(b) < 2:      # listed, not tested (e.g. a row whose seeds did not all run)
                d, p, method = float(np.mean(a) - np.mean(b)), None, "too few runs"
            else:
                d, p, method = permutation_test(a, b)
            out.append({"row": row, "metric": m, "runs": len(a), "baseline_runs": len(b),
                        "mean": float(np.mean(a)), "baseline_mean": float(np.mean(b)),
                        "range": [min(a), max(a)], "baseline_range": [min(b), max(b)],
                        "difference": d, "p_value": p, "method": method})
    if not any(t["p_value"] is not None for t in out):
        raise ValueError(f"no row has >= 2 runs of a tested metric beside the baseline's (rows: {rows})")
    return out


def markdown(tests: list[dict], runs: list[dict], baseline: str, alpha: float) -> str:
    k = sum(t["p_value"] is not None for t in tests)
    lines = [f"# Co-trained rows against {baseline!r}: run means, permutation test", "",
             "| row | metric | runs | mean [range] | baseline runs | baseline mean [range] | difference | p | "
             f"p < {alpha:g}/{k} |", "|---|---|---|---|---|---|---|---|---|"]
    for t in tests:
        lines.append(f"| {t['row']} | {t['metric']} | {t['runs']} | {t['mean']:.4g} [{t['range'][0]:.4g}, "
                     f"{t['range'][1]:.4g}] | {t['baseline_runs']} | {t['baseline_mean']:.4g} "
                     f"[{t['baseline_range'][0]:.4g}, {t['baseline_range'][1]:.4g}] | {t['difference']:+.4g} | "
                     + (f"{t['p_value']:.3g} ({t['method']}) | {'yes' if t['p_value'] < alpha / k else 'no'} |"
                        if t["p_value"] is not None else f"- ({t['method']}) | - |"))
    lines += ["", f"Per run, the mean of each metric over all its logged steps; p: two-sided permutation test of the "
              f"difference of those means between the row's runs and the baseline's; the last column applies "
              f"Bonferroni over the {k} tests at level {alpha:g}.", "", "| run | row | sampling seed | steps | "
              + " | ".join(f"mean {m}" for m in METRICS) + " |", "|---|---|---|---|" + "---|" * len(METRICS)]
    for r in sorted(runs, key=lambda r: (r["row"], r["sampling_seed"])):
        lines.append(f"| {r['run']} | {r['row']} | {r['sampling_seed']} | {r['steps']} | "
                     + " | ".join(f"{r['mean'][m]:.4g}" if m in r["mean"] else "-" for m in METRICS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, type=Path, action="append",
                    help="a run folder (env.json + metrics.jsonl, as repro.rl.run writes them) or a folder whose "
                         "subfolders are run folders; repeat it to pool runs kept in several places")
    ap.add_argument("--baseline", default="no draft", help="row label of the no-draft runs (default: 'no draft')")
    ap.add_argument("--alpha", type=float, default=0.05, help="family-wise level, split over the tests (Bonferroni)")
    ap.add_argument("--out", required=True, type=Path, help="report folder (report.json, report.md)")
    args = ap.parse_args(argv)
    if not 0 < args.alpha < 1:
        ap.error(f"--alpha {args.alpha}: expected a level between 0 and 1")
    dirs: list[Path] = []
    for root in args.runs:
        found = [root] if (root / "env.json").is_file() else sorted(p.parent for p in root.glob("*/env.json"))
        if not found:
            ap.error(f"--runs {root}: not a run folder and no run folders (subfolders with env.json) there")
        dirs += [d for d in found if d not in dirs]
    try:
        runs = [read_run(d) for d in dirs]
        tests = compare(runs, args.baseline)
    except (ValueError, FileNotFoundError) as exc:
        print(f"exchangeability: error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "report.json", {
        "baseline": args.baseline, "alpha": args.alpha, "tests": tests, "runs": runs,
        "provenance": provenance({"runs": [str(r) for r in args.runs]})})
    md = markdown(tests, runs, args.baseline, args.alpha)
    write_atomic(args.out / "report.md", md.encode())
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
