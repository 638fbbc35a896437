"""Table 1: acceptance length, rollout speedup and end-to-end speedup per (target, draft) row, paper beside ours.

Reads the summary rows ``repro.rl.summary`` logged (metric names as in experiments/paper_numbers.csv)
from the collected tidy table; never re-runs anything. Every paper row is listed; a row this profile
did not run shows "-" in the measured columns. Measured values carry their hardware (cpu-emulated on
CPUs), paper values the paper's.

    python -m repro.report.build --artifact table1 --profile cpu-tiny \
        --tidy results/tidy/cpu-tiny/table1.csv --out paper_figures/cpu-tiny
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from repro.report.tables import latest, warm_up_notes, write_table

METRICS = (("acceptance_length", "AL"), ("rollout_speedup", "rollout"), ("e2e_speedup", "E2E"),
           ("e2e_speedup_free_draft_update", "E2E, draft update free"),     # what the rollout alone gives
           ("rollout_share_of_step_pct", "rollout share of step %"))   # no-draft rows: the part a draft speeds up


LOCKSTEP_NOTE = ("Measured on '..., lockstep': the row and its no-draft baseline trained in one process, their steps "
                 "interleaved (repro.rl.lockstep), so drift in the host's speed (launch-bound runs on one GPU) hits "
                 "both alike.")


def latest_values(tidy: pd.DataFrame, metrics) -> pd.DataFrame:
    """One value per (hardware, row, metric): the last logged (by run, then step)."""
    return latest(tidy[tidy["metric"].isin(list(metrics))])


def of_machine(values: pd.DataFrame, row: str, hardware: str, label: str) -> pd.DataFrame:
    """``values`` of ``row`` measured on one machine: its tag and its label (a reference of this tag stays apart)."""
    return values[(values["row"] == row) & (values["hardware"] == hardware) & (values["hardware_label"] == label)]


def paper_value(paper: pd.DataFrame, row: str, metric: str):
    hit = paper[(paper["row"] == row) & (paper["metric"] == metric) & (paper["stat"] == "value")]
    return (float(hit["value"].iloc[0]), str(hit["paper_hardware"].iloc[0])) if len(hit) else (None, "")


def comparison_table(tidy: pd.DataFrame, paper: pd.DataFrame, metrics, row_order: list[str]) -> pd.DataFrame:
    """Rows: every paper row (in paper order) then measured rows the paper lacks; measured and paper columns (a
    metric the paper does not report, e.g. an interval of ours, gets no paper column)."""
    names = [m for m, _ in metrics]
    meas = latest_values(tidy, names)
    lockstep = latest_values(tidy, ["lockstep_rows"])
    hw = sorted(set(zip(meas["hardware"], meas["hardware_label"]))) or [("-", "")]
    rows = list(row_order) + [r for r in meas["row"].drop_duplicates() if r not in row_order]
    lines = []
    for row in rows:
        for h, label in hw:
            line = {"row": row, "measured on": f"{h} ({label})" if label else h}
            if (of_machine(lockstep, row, h, label)["value"] > 1).any():
                line["measured on"] += ", lockstep"
            got = of_machine(meas, row, h, label)
            for m, short in metrics:
                v = got[got["metric"] == m]["value"]
                line[f"{short} (ours)"] = float(v.iloc[0]) if len(v) else None
            paper_hw = ""
            for m, short in metrics:
                pv, phw = paper_value(paper, row, m)
                line[f"{short} (paper)"] = pv
                paper_hw = paper_hw or phw
            line["paper hardware"] = paper_hw or "-"
            if all(line[f"{s} (ours)"] is None for _, s in metrics):
                line["measured on"] = "-"
            lines.append(line)
    df = pd.DataFrame(lines).drop_duplicates()
    ours = [f"{s} (ours)" for _, s in metrics]
    papers = [f"{s} (paper)" for _, s in metrics]
    df = df[df[ours + papers].notna().any(axis=1)]
    papers = [p for p in papers if df[p].notna().any()]
    return df[["row", "measured on", *ours, "paper hardware", *papers]].reset_index(drop=True)


def build(tidy: pd.DataFrame, paper: pd.DataFrame, out_dir: Path) -> list[Path]:
    order = [r for r in paper[paper["metric"] == "acceptance_length"]["row"].drop_duplicates() if r != "abstract"]
    df = comparison_table(tidy, paper, METRICS, order)
    notes = ["Speedups: generated tokens per second of rollout (rollout) and of the whole step (E2E), "
             "co-trained run over its no-draft run of the same configuration (repro.rl.summary); time is wall "
             "time on GPUs and process CPU time plus tool latency on CPU profiles (shared cores make wall time "
             "noisy; the wall ratios are in the collected data as *_wall).",
             "E2E, draft update free: the E2E speedup had every step of the row updated in the no-draft row's "
             "mean update time, i.e. with co-training free; its gap to E2E is the draft's training cost, its gap "
             "to the paper's E2E is the rollout's (its speedup and its share of the step).",
             "On cpu-tiny and h200 the rows are played by scaled-down policies (dense for Qwen3-8B, MoE for "
             "Qwen3.5-35B-A3B); absolute behaviour is not the paper's, the comparison is of mechanisms."]
    if df["measured on"].str.endswith(", lockstep").any():
        notes.insert(1, LOCKSTEP_NOTE)
    notes += warm_up_notes(tidy)
    return write_table(df, Path(out_dir) / "table1", title="Table 1: end-to-end speculative decoding in RL",
                       notes=notes)
