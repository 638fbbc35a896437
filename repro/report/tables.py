"""Tables as CSV and Markdown, written atomically; the latest value of each tidy row the artifacts tabulate.

    write_table(df, "paper_figures/cpu-tiny/table1")  ->  table1.csv, table1.md
"""
from __future__ import annotations

import io
import math
import os
from pathlib import Path

import pandas as pd

from repro.core.io import write_atomic


def latest(tidy: pd.DataFrame) -> pd.DataFrame:
    """The last value of every (hardware, row, metric), by run then step: a rerun replaces, never averages."""
    t = tidy.sort_values(["run", "step"], kind="stable")
    return t.groupby(["hardware", "hardware_label", "row", "metric"], as_index=False).last()


# per-step work that belongs in a run's warm-up: the summary metric counting the averaged steps that did it, what
# they did, and the metrics.jsonl column that tells which steps
WARM_UP_WORK = {"averaged_steps_compiling": ("Times include compilations: dynamo compiled graphs", "compilation",
                                             "train/compiled_graphs"),
                "averaged_steps_capturing": ("Times include CUDA graph captures: graphs were captured", "captures",
                                             "train/step_graph_captures")}


def warm_up_notes(tidy: pd.DataFrame) -> list[str]:
    """The table notes naming the rows whose averaged steps compiled or captured graphs
    (``averaged_steps_compiling`` / ``averaged_steps_capturing`` of repro.rl.summary): one note for each kind some
    row's did."""
    notes = []
    for metric, (what, work, column) in WARM_UP_WORK.items():
        hits = latest(tidy[tidy["metric"] == metric])
        hits = hits[hits["value"] > 0]
        if hits.empty:
            continue
        where = ", ".join(f"{r.row} on {r.hardware} ({r.value:.0f})" for r in hits.itertuples())
        notes.append(f"{what} inside averaged steps of {where} (steps in brackets; {column} in each run's "
                     f"metrics.jsonl); those rows' times and speedups carry the {work}.")
    return notes


def format_value(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 10 ** -(digits - 1) or abs(value) >= 10 ** 6):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}g}" if abs(value) >= 10 ** digits else f"{value:.{digits}f}".rstrip("0").rstrip(".")
    return str(value)


def to_markdown(df: pd.DataFrame, title: str | None = None, notes: list[str] | None = None) -> str:
    lines = [f"# {title}", ""] if title else []
    cols = [str(c) for c in df.columns]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "|".join("---" for _ in cols) + "|")
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(format_value(v).replace("|", "\\|") for v in r.tolist()) + " |")
    if notes:
        lines += [""] + [f"{n}" for n in notes]
    return "\n".join(lines) + "\n"


def write_table(df: pd.DataFrame, stem: str | os.PathLike, title: str | None = None,
                notes: list[str] | None = None) -> list[Path]:
    stem = Path(stem)
    buf = io.StringIO()
    df.to_csv(buf, index=False, lineterminator="\n")
    return [write_atomic(stem.with_suffix(".csv"), buf.getvalue()),
            write_atomic(stem.with_suffix(".md"), to_markdown(df, title, notes))]


MEASURED_VS_PAPER_COLUMNS = ["row", "metric", "measured", "measured on", "paper", "paper hardware"]


def measured_vs_paper(measured_row, paper_rows: pd.DataFrame) -> dict:
    """One table line: a tidy measurement beside the paper's value (first of ``paper_rows``, if any)."""
    has_paper = len(paper_rows) > 0
    return {"row": measured_row["row"], "metric": measured_row["metric"], "measured": measured_row["value"],
            "measured on": f"{measured_row['hardware']} ({measured_row['hardware_label']})",
            "paper": float(paper_rows["value"].iloc[0]) if has_paper else None,
            "paper hardware": paper_rows["paper_hardware"].iloc[0] if has_paper else "-"}

