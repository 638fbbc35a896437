"""Figure 4: GRPO on the multi-turn workplace tool environment per training step, baseline and three drafts.

The same six panels as Figure 3 (``repro.report.artifacts.fig3.build_curves``) from the fig4 runs,
whose rollouts include tool calls with a configurable latency; the paper's final acceptance-length
range is drawn dashed on the acceptance panel, and the summary (speedups, rollout share of the step)
goes beside the paper's values in ``fig4.md``/``.csv``. With ``baseline_seeds`` in the profile's fig4
section the baseline's seed band and each drafted row's verdict are added as for Figure 3
(``fig4_spread.csv``; definitions in ``repro.report.seed_spread``).

    python -m repro.report.build --artifact fig4 --profile cpu-tiny \
        --tidy results/tidy/cpu-tiny/fig4.csv --out paper_figures/cpu-tiny
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from repro.report.artifacts.fig3 import build_curves


def build(tidy: pd.DataFrame, paper: pd.DataFrame, out_dir: Path) -> list[Path]:
    return build_curves(tidy, paper, out_dir, "fig4", "Figure 4: co-training on multi-turn tool use")
