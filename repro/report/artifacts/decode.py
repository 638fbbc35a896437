"""The decode benchmark's table and figure: our engine, the peers and the floor side by side, per batch size.

Reads only collected tidy rows of repro.bench.decode: ``suite-<mode>/<family>/b<B>`` (ms_per_step,
tokens_per_s, acceptance_length, speedup, speedup_over_al, speedup_cpu_over_al, occupancy), ``peer/<peer>/b<B>``
(ms_per_step, tokens_per_s), ``floor/b<B>`` (ms_per_step) and ``bound/<family>/b<B>`` (verify_over_decode).
Two columns are derived from them, per family row of our engine: ``over_fastest_plain``, its tokens/s over the
fastest plain decoding of the same machine and batch (any mode of ours or a peer: a speedup measured against a
slow mode's own plain row says little about decoding faster), and ``ceiling_over_al``, occupancy over the family's
``verify_over_decode``: the most speedup / AL can reach at that batch with a free draft (rows that finish early
idle while the batch steps on, and each step verifies k+1 tokens).
Writes decode.pdf/.png (one row of panels per machine; left: ms per step of plain decoding for each engine mode,
each peer and the floor against batch; right: speedup / acceptance length of each family (a colour) and mode (a line
style) against batch, with the bound ``1 / verify_over_decode`` dotted) and decode.csv/.md (one line per batch and
engine). The paper reports no decode benchmark, so nothing here is drawn from paper numbers.

    python -m repro.report.build --artifact decode --profile h200 --tidy results/tidy/h200/decode.csv \
        --out paper_figures/h200
"""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from repro.report.style import measured_label, measured_title, save_figure
from repro.report.tables import latest, write_table

ROW = re.compile(r"^(?P<kind>suite-[a-z_]+|peer/[a-z0-9-]+|floor|bound)(?:/(?P<family>[a-z0-9]+))?/b(?P<batch>\d+)$")
TABLE_METRICS = ("ms_per_step", "tokens_per_s", "acceptance_length", "speedup", "speedup_over_al",
                 "speedup_cpu_over_al", "occupancy", "verify_over_decode", "ceiling_over_al", "over_fastest_plain")
KEY = ["hardware", "hardware_label", "batch"]      # one machine's run (a reference and a local run may share a tag)


def decode_rows(tidy: pd.DataFrame) -> pd.DataFrame:
    """One row per (hardware, kind, family, batch) with the latest value of each metric as a column."""
    t = latest(tidy)
    p = t["row"].str.extract(ROW)
    t = pd.concat([t, p], axis=1).dropna(subset=["kind"])
    t["family"] = t["family"].fillna("plain")
    t["batch"] = t["batch"].astype(int)
    wide = t.pivot_table(index=["hardware", "hardware_label", "kind", "family", "batch"], columns="metric",
                         values="value").reset_index()
    return derived(wide).sort_values(["hardware", "batch", "kind", "family"], kind="stable").reset_index(drop=True)


def derived(wide: pd.DataFrame) -> pd.DataFrame:
    """``over_fastest_plain`` and ``ceiling_over_al`` on our engine's family rows (module docstring)."""
    ours = wide["kind"].str.startswith("suite-")
    spec = ours & (wide["family"] != "plain")
    if "tokens_per_s" in wide:
        plain = wide[(wide["family"] == "plain") & (ours | wide["kind"].str.startswith("peer/"))]
        fastest = plain.groupby(KEY)["tokens_per_s"].max().rename("fastest_plain")
        got = wide.join(fastest, on=KEY)
        wide.loc[spec, "over_fastest_plain"] = got.loc[spec, "tokens_per_s"] / got.loc[spec, "fastest_plain"]
    if "verify_over_decode" in wide and "occupancy" in wide:
        bound = (wide[wide["kind"] == "bound"].set_index(KEY + ["family"])["verify_over_decode"]
                 .rename("bound_ratio"))
        got = wide.join(bound, on=KEY + ["family"])
        wide.loc[spec, "ceiling_over_al"] = got.loc[spec, "occupancy"] / got.loc[spec, "bound_ratio"]
    return wide


def summary_table(rows: pd.DataFrame) -> pd.DataFrame:
    cols = ["hardware", "batch", "kind", "family"] + [m for m in TABLE_METRICS if m in rows]
    df = rows[cols].copy()
    df["hardware"] = [f"{h} ({lab})" if lab else h for h, lab in zip(rows["hardware"], rows["hardware_label"])]
    df["engine"] = df["kind"].str.replace("suite-", "ours, cuda_graphs=", regex=False)
    return df[["hardware", "batch", "engine", "family"] + cols[4:]]


PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
MODE_LINES = {"off": "-.", "draft": (0, (1, 1)), "all": "--", "whole_drafts": (0, (5, 2)),
              "compiled": (0, (5, 1, 1, 1)), "compiled_drafts": (0, (3, 1, 1, 1, 1, 1)), "fused": "-"}


def _colors(names) -> dict[str, str]:
    """One colour per name, the same in every machine's row (sorted, so a machine lacking a series shifts none)."""
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(sorted(set(names)))}


def _draw_machine(ax_t, ax_r, h: pd.DataFrame, label: str, colors: dict[str, str]) -> None:
    """One machine's rows: plain decoding per engine mode, peer and floor (left); speedup / AL per family, the
    family's colour and the mode's line, with the bound dotted (right)."""
    plain = h[(h["family"] == "plain") & (h["kind"] != "bound")]
    for kind, g in plain.groupby("kind"):
        if "ms_per_step" not in g or g["ms_per_step"].isna().all():
            continue
        if kind == "floor":
            style = {"linestyle": ":", "color": "0.4"}
        else:
            mode = kind.removeprefix("suite-")
            peer = kind.startswith("peer/")           # peers: square markers, ours: round
            style = {"marker": "s" if peer else "o", "markersize": 3, "color": colors[kind],
                     "linestyle": "--" if peer else MODE_LINES.get(mode, "-")}
        name = {"floor": "floor (weights at copy bandwidth)"}.get(kind, kind.replace("suite-", "ours "))
        ax_t.plot(g["batch"], g["ms_per_step"], label=name, **style)
    spec = h[h["kind"].str.startswith("suite-") & (h["family"] != "plain")]
    col = "speedup_cpu_over_al" if label == "cpu-emulated" and "speedup_cpu_over_al" in spec else "speedup_over_al"
    for (kind, fam), g in spec.groupby(["kind", "family"]):
        if col in g and not g[col].isna().all():
            mode = kind.removeprefix("suite-")
            ax_r.plot(g["batch"], g[col], marker="o", markersize=3, color=colors[fam],
                      linestyle=MODE_LINES.get(mode, "-"), label=f"{fam} ours {mode}")
    for fam, g in h[h["kind"] == "bound"].groupby("family"):
        if "verify_over_decode" in g:
            ax_r.plot(g["batch"], 1 / g["verify_over_decode"], linestyle=":", linewidth=0.8, color=colors[fam],
                      label=f"{fam} bound (1 / verify over decode step)")


def build(tidy: pd.DataFrame, paper: pd.DataFrame, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    rows = decode_rows(tidy)
    if rows.empty:
        raise ValueError("no decode rows ('suite-<mode>/<family>/b<B>', 'peer/<peer>/b<B>', 'floor/b<B>') "
                         "in the tidy table")
    machines = list(rows.groupby(["hardware", "hardware_label"]).groups)
    # one row of panels per machine, each named in its panels' titles (one machine: in the figure's title)
    fig, axes = plt.subplots(len(machines), 2, figsize=(7.2, 1.2 + 1.9 * len(machines)), squeeze=False)
    plain_kinds = rows.loc[(rows["family"] == "plain") & ~rows["kind"].isin(["bound", "floor"]), "kind"]
    colors = {**_colors(plain_kinds), **_colors(rows.loc[rows["family"] != "plain", "family"])}
    ticks = sorted(set(rows["batch"]))
    for (ax_t, ax_r), ((hw, label), h) in zip(axes, rows.groupby(["hardware", "hardware_label"])):
        _draw_machine(ax_t, ax_r, h, label, colors)
        ax_t.set(xscale="log", yscale="log", ylabel="ms per step (plain decoding)")
        ax_r.set(xscale="log", ylabel="speedup / acceptance length")
        if len(machines) > 1:
            for ax in (ax_t, ax_r):
                ax.set_title(measured_label(hw, label), fontsize=6)
        for ax in (ax_t, ax_r):
            ax.set_xticks(ticks, [str(b) for b in ticks])
            ax.xaxis.set_minor_locator(plt.NullLocator())
    for col in range(2):
        axes[-1][col].set_xlabel("batch")
        handles: dict[str, object] = {}
        for ax in axes[:, col]:             # every machine's series once, under the last row
            for hnd, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, hnd)
        axes[-1][col].legend(list(handles.values()), list(handles), fontsize=4.5, loc="upper center",
                             bbox_to_anchor=(0.5, -0.3), frameon=False, ncols=2 if col else 1)
    title = "Decode: our engine, the peers and the floor, same run"
    fig.suptitle(measured_title(title, machines) if len(machines) == 1 else title, fontsize=8)
    paths = save_figure(fig, out_dir / "decode")
    notes = ["Every row of one hardware comes from one run: same weights, prompts, temperature 1, no stop token.",
             ("speedup: plain decoding in the same engine mode over the family's; speedup / AL near 1 means the "
              "draft and the engine cost nothing beyond the policy's verify step."),
             ("bound: the policy's verify step over k+1 tokens against its one-token step; speedup / AL cannot "
              "pass its inverse however cheap the draft (on a CPU the verify step is compute-bound)."),
             ("ceiling_over_al: occupancy over that ratio, the most speedup / AL can reach at the batch with a free "
              "draft (occupancy: the share of a batch's row-steps still generating; a batch steps until its "
              "slowest row is done)."),
             ("over_fastest_plain: the family's tokens/s over the fastest plain decoding of the machine and batch, "
              "any mode of ours or a peer: above 1, speculative decoding beats every plain engine of the run."),
             "CPU runs are cpu-emulated: compare ratios only; their speedups are also given from process CPU time."]
    paths += write_table(summary_table(rows), out_dir / "decode",
                         title="Decode benchmark: ours, the peers and the floor", notes=notes)
    return paths
