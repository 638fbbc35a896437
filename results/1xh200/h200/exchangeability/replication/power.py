"""Power of this replication's design (6 co-trained runs against the 14 new no-draft runs, two-sided permutation test
at 0.05) for a shift of the run-mean reward, with normal run means of the new runs' standard deviation: 400 simulated
draws per shift, each tested with 2,000 random splits (seeded). Writes power.json beside this file.

    .venv/bin/python results/1xh200/h200/exchangeability/replication/power.py
"""
import json
from pathlib import Path

import numpy as np

from repro.report.provenance import provenance, write_json_atomic

HERE = Path(__file__).parent
runs = json.loads((HERE / "report" / "report.json").read_text())["runs"]
new = np.array([r["mean"]["train/reward"] for r in runs if r["row"] == "no draft"])
sd = float(new.std(ddof=1))
rng = np.random.default_rng(0)


def p_value(a, b, splits=2000):
    pooled, n = np.concatenate([a, b]), len(a)
    idx = np.argsort(rng.random((splits, len(pooled))), axis=1)[:, :n]
    s = pooled[idx].sum(1)
    d = np.abs(s / n - (pooled.sum() - s) / (len(pooled) - n))
    return (np.sum(d >= abs(a.mean() - b.mean()) - 1e-15) + 1) / (splits + 1)


power = {str(shift): float(np.mean([p_value(rng.normal(-shift, sd, 6), rng.normal(0, sd, len(new))) < 0.05
                                    for _ in range(400)])) for shift in (0.004, 0.006)}
cfg = {"co_trained_runs": 6, "baseline_runs": len(new), "baseline_sd": sd, "draws": 400, "splits": 2000,
       "level": 0.05, "seed": 0}
write_json_atomic(HERE / "power.json", {"power_by_shift": power, "config": cfg, "provenance": provenance(cfg)})
print(power, cfg)
