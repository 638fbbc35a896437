"""Table 2: pipeline-parallel overhead of co-training (mean of the first 10 updates), paper beside ours.

Columns per row (no draft, EAGLE-3, DFlash, DSpark): acceptance length, rollout time and speedup,
update time and overhead over the no-draft update, tap wait, end-to-end speedup; all from the summary
rows of ``repro.rl.summary`` in the collected tidy table.

    python -m repro.report.build --artifact table2 --profile cpu-tiny \
        --tidy results/tidy/cpu-tiny/table2.csv --out paper_figures/cpu-tiny
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from repro.report.artifacts.table1 import LOCKSTEP_NOTE, comparison_table
from repro.report.tables import warm_up_notes, write_table

METRICS = (("acceptance_length", "AL"), ("rollout_time_s", "rollout s"), ("rollout_speedup", "rollout x"),
           ("update_time_s", "update s"), ("update_overhead_pct", "update overhead %"),
           ("update_overhead_ci95_low_pct", "overhead 95% CI low %"),
           ("update_overhead_ci95_high_pct", "overhead 95% CI high %"),
           ("tap_wait_s", "tap wait s"), ("e2e_speedup", "E2E x"), ("rollout_share_of_step_pct", "rollout share %"))
ROWS = ["no draft", "EAGLE-3", "DFlash", "DSpark"]


def build(tidy: pd.DataFrame, paper: pd.DataFrame, out_dir: Path) -> list[Path]:
    df = comparison_table(tidy, paper, METRICS, ROWS)
    notes = ["Mean of the first 10 policy updates after the warm-up step(s) the profile skips.",
             "Overhead 95% CI: percentile bootstrap of the update overhead over the steps, lockstep steps "
             "resampled in pairs (repro.rl.summary; '-' for summaries written before it existed).",
             "Tap wait is logged only by runs whose policy is split into pipeline stages with a TapChannel; "
             "single-process runs show '-'.",
             "Seconds, speedups and update overhead are wall time on GPUs and process CPU time (+ tool latency) "
             "on CPU profiles, whose shared cores make wall time noisy (wall values: *_wall in the collected data; "
             "repro.rl.summary).",
             "Absolute seconds are not comparable across hardware or workload scale; the ratios are."]
    if df["measured on"].str.endswith(", lockstep").any():
        notes.insert(1, LOCKSTEP_NOTE)
    notes += warm_up_notes(tidy)
    return write_table(df, Path(out_dir) / "table2", title="Table 2: pipeline-parallel co-training overhead",
                       notes=notes)
