"""The decode benchmark's table and figure: our engine, the peers and the floor side by side, per batch size.

Reads only collected tidy rows of repro.bench.decode: ``suite-<mode>/<family>/b<B>`` (ms_per_step,
tokens_per_s, acceptance_length, speedup, speedup_over_al, speedup_cpu_over_al, occupancy), ``peer/<peer>/b<B>``
(ms_per_step, tokens_per_s), ``floor/b<B>`` (ms_per_step) and ``bound/<family>/b<B>`` (verify_over_decode).
Writes decode.pdf/.png (left: ms per step of plain decoding for each engine mode, each peer and the floor
against batch; right: speedup / acceptance length of each family and mode against batch, with the bound
``1 / verify_over_decode`` dotted) and decode.csv/.md (one line per batch and engine). The paper reports no
decode benchmark, so nothing here is drawn from paper numbers.

    python -m repro.report.build --artifact decode --profile h200 --tidy results/tidy/h200/decode.csv \
        --out paper_figures/h200
"""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from repro.report.style import legend_below, measured_label, measured_title, save_figure
from repro.report.tables import latest, write_table

ROW = re.compile(r"^(?P<kind>suite-[a-z]+|peer/[a-z0-9-]+|floor|bound)(?:/(?P<family>[a-z0-9]+))?/b(?P<batch>\d+)$")
TABLE_METRICS = ("ms_per_step", "tokens_per_s", "acceptance_length", "speedup", "speedup_over_al",
                 "speedup_cpu_over_al", "occupancy", "verify_over_decode")


def decode_rows(tidy: pd.DataFrame) -> pd.DataFrame:
    """One row per (hardware, kind, family, batch) with the latest value of each metric as a column."""
    t = latest(tidy)
    p = t["row"].str.extract(ROW)
    t = pd.concat([t, p], axis=1).dropna(subset=["kind"])
    t["family"] = t["family"].fillna("plain")
    t["batch"] = t["batch"].astype(int)
    wide = t.pivot_table(index=["hardware", "hardware_label", "kind", "family", "batch"], columns="metric",
                         values="value").reset_index()
    return wide.sort_values(["hardware", "batch", "kind", "family"], kind="stable").reset_index(drop=True)


def summary_table(rows: pd.DataFrame) -> pd.DataFrame:
    cols = ["hardware", "batch", "kind", "family"] + [m for m in TABLE_METRICS if m in rows]
    df = rows[cols].copy()
    df["hardware"] = [f"{h} ({lab})" if lab else h for h, lab in zip(rows["hardware"], rows["hardware_label"])]
    df["engine"] = df["kind"].str.replace("suite-", "ours, cuda_graphs=", regex=False)
    return df[["hardware", "batch", "engine", "family"] + cols[4:]]


def build(tidy: pd.DataFrame, paper: pd.DataFrame, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    rows = decode_rows(tidy)
    if rows.empty:
        raise ValueError("no decode rows ('suite-<mode>/<family>/b<B>', 'peer/<peer>/b<B>', 'floor/b<B>') "
                         "in the tidy table")
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(7.2, 2.8))
    machines = list(rows.groupby(["hardware", "hardware_label"]).groups)
    for (hw, label), h in rows.groupby(["hardware", "hardware_label"]):
        # one machine: named once, in the title; several: in every entry
        where = "" if len(machines) == 1 else f" — {measured_label(hw, label)}"
        plain = h[(h["family"] == "plain") & (h["kind"] != "bound")]
        for kind, g in plain.groupby("kind"):
            if "ms_per_step" not in g or g["ms_per_step"].isna().all():
                continue
            style = {"linestyle": ":", "color": "0.4"} if kind == "floor" else {
                "linestyle": "--" if kind.startswith("peer/") else "-", "marker": "o", "markersize": 3}
            name = {"floor": "floor (weights at copy bandwidth)"}.get(kind, kind.replace("suite-", "ours "))
            ax_t.plot(g["batch"], g["ms_per_step"], label=f"{name}{where}", **style)
        spec = h[h["kind"].str.startswith("suite-") & (h["family"] != "plain")]
        col = "speedup_cpu_over_al" if label == "cpu-emulated" and "speedup_cpu_over_al" in spec else "speedup_over_al"
        for (kind, fam), g in spec.groupby(["kind", "family"]):
            if col in g and not g[col].isna().all():
                ax_r.plot(g["batch"], g[col], marker="o", markersize=3,
                          label=f"{fam} {kind.replace('suite-', 'ours ')}{where}")
        bound = h[h["kind"] == "bound"]
        for fam, g in bound.groupby("family"):
            if "verify_over_decode" in g:
                ax_r.plot(g["batch"], 1 / g["verify_over_decode"], linestyle=":", label=f"{fam} bound (1 / verify"
                          f" over decode step){where}")
    ax_t.set(xscale="log", yscale="log", xlabel="batch", ylabel="ms per step (plain decoding)")
    ax_r.set(xscale="log", xlabel="batch", ylabel="speedup / acceptance length")
    for ax in (ax_t, ax_r):
        ticks = sorted(set(rows["batch"]))
        ax.set_xticks(ticks, [str(b) for b in ticks])
        ax.xaxis.set_minor_locator(plt.NullLocator())
        legend_below(ax, fontsize=4.5)
    title = "Decode: our engine, the peers and the floor, same run"
    fig.suptitle(measured_title(title, machines) if len(machines) == 1 else title, fontsize=8)
    paths = save_figure(fig, out_dir / "decode")
    notes = ["Every row of one hardware comes from one run: same weights, prompts, temperature 1, no stop token.",
             ("speedup: plain decoding in the same engine mode over the family's; speedup / AL near 1 means the "
              "draft and the engine cost nothing beyond the policy's verify step."),
             ("bound: the policy's verify step over k+1 tokens against its one-token step; speedup / AL cannot "
              "pass its inverse however cheap the draft (on a CPU the verify step is compute-bound)."),
             "CPU runs are cpu-emulated: compare ratios only; their speedups are also given from process CPU time."]
    paths += write_table(summary_table(rows), out_dir / "decode",
                         title="Decode benchmark: ours, the peers and the floor", notes=notes)
    return paths
