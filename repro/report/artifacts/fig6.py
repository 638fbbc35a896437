"""Figure 6: draft-training attention at fixed global lengths (TTT and block-draft), per CP size.

Reads only collected tidy rows of repro.bench.fig6 ("<kind> <T> cp=<C>" with time_s and peak_mem_gb for the
kinds ttt, trunk, sdpa_cudnn, block and the other block routes block_*; the same rows with the same-run ratios
branch_overhead_pct (ttt), speedup_vs_sdpa_cudnn (trunk), speedup_vs_block (block_*); "<kind> <T>" with CP
speedups/efficiency; "<block route> cp=<C>" max_time_s) and the paper's numbers.
Writes fig6.pdf/.png (TTT time, block-draft
time, TTT peak memory vs tokens; paper values hollow/dashed, labelled with the paper's hardware) and
fig6.csv/.md (every measured row beside the paper's value where it has one).

    python -m repro.report.build --artifact fig6 --profile h200 --tidy results/tidy/h200/fig6.csv \
        --out paper_figures/h200
"""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from repro.report.style import (
    legend_below,
    log_ticks_at,
    measured_title,
    paper_label,
    paper_style,
    plain_log_labels,
    save_figure,
    series_label,
)
from repro.report.tables import MEASURED_VS_PAPER_COLUMNS, latest, measured_vs_paper, write_table

ROW = re.compile(r"^(?P<kind>[a-z_][a-z0-9_]*) (?P<tok>\d+)(?P<k>K?) cp=(?P<cp>\d+)$")
TABLE_METRICS = ("time_s", "cpu_critical_s", "peak_mem_gb", "inputs_gb", "tflops", "branch_overhead_pct",
                 "parallel_efficiency_pct", "max_time_s", "cuda_kernels", "busy_fraction")
KIND_STYLE = {"ttt": "-", "trunk": "--", "sdpa_cudnn": ":", "block": "-", "block_sdpa": (0, (1, 1)),
              "block_flash4": "--", "block_flash4_rep": "-.", "block_fused": ":", "block_auto": (0, (3, 1, 1, 1))}


def config_rows(tidy: pd.DataFrame) -> pd.DataFrame:
    """One row per (hardware, kind, tokens, cp) with its metrics as columns."""
    t = latest(tidy)
    p = t["row"].str.extract(ROW)
    t = pd.concat([t, p], axis=1).dropna(subset=["kind"])
    t["tokens"] = t["tok"].astype(int) * t["k"].map({"K": 1024, "": 1})
    t["cp"] = t["cp"].astype(int)
    return t.pivot_table(index=["hardware", "hardware_label", "kind", "tokens", "cp"], columns="metric",
                         values="value").reset_index()


def _tok_label(n: float) -> str:
    n = int(n)
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def _paper_points(paper: pd.DataFrame, row_re: str, metric: str) -> list[tuple[int, int, float, str]]:
    out = []
    for _, r in paper[(paper["metric"] == metric) & paper["row"].str.match(row_re)].iterrows():
        m = re.match(r"^\w+ (\d+)K cp=(\d+)$", r["row"])
        if m:
            out.append((int(m.group(1)) * 1024, int(m.group(2)), float(r["value"]), r["paper_hardware"]))
    return out


def summary_table(tidy: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    t = latest(tidy)
    lines = []
    for _, r in t.iterrows():
        if r["metric"] not in TABLE_METRICS and not r["metric"].startswith("speedup_"):
            continue
        p = paper[(paper["row"] == r["row"]) & (paper["metric"] == r["metric"])]
        lines.append(measured_vs_paper(r, p))
    df = pd.DataFrame(lines, columns=MEASURED_VS_PAPER_COLUMNS)
    return df.sort_values(["row", "metric"], kind="stable").reset_index(drop=True)


def build(tidy: pd.DataFrame, paper: pd.DataFrame, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    cfg = config_rows(tidy)
    if cfg.empty:
        raise ValueError("no fig6 rows ('<kind> <tokens> cp=<C>') in the tidy table")
    fig, (ax_t, ax_b, ax_m) = plt.subplots(1, 3, figsize=(7.2, 3.0), layout="constrained")
    machines = sorted(set(zip(cfg["hardware"], cfg["hardware_label"])))
    for (hw, label, kind, cp), g in cfg.groupby(["hardware", "hardware_label", "kind", "cp"]):
        g = g.sort_values("tokens")
        # CPU runs: the critical path (largest per-rank CPU time), the basis of their speedups.
        tcol = "cpu_critical_s" if label.startswith("cpu-emulated") and "cpu_critical_s" in g else "time_s"
        if tcol not in g or g[tcol].isna().all():
            continue
        ax = ax_b if kind.startswith("block") else ax_t
        ax.plot(g["tokens"], g[tcol], linestyle=KIND_STYLE.get(kind, "-"), marker="o", markersize=3,
                label=series_label(f"{kind} cp={cp}", hw, label, len(machines)))
        if kind == "ttt" and "peak_mem_gb" in g:
            ax_m.plot(g["tokens"], g["peak_mem_gb"], marker="o", markersize=3,
                      label=series_label(f"ttt cp={cp}", hw, label, len(machines)))
    for ax, row_re, metric in ((ax_t, r"^ttt \d+K cp=\d+$", "time_s"), (ax_m, r"^ttt \d+K cp=\d+$", "peak_mem_gb")):
        pts = _paper_points(paper, row_re, metric)
        for tok, cp, val, hw in pts:
            ax.plot([tok], [val], **paper_style("marker"))
            ax.annotate(f"cp={cp}", (tok, val), fontsize=4.5, xytext=(3, 0), textcoords="offset points")
        if pts:
            ax.plot([], [], **paper_style("marker"), label=paper_label(pts[0][3]))
    pb = paper[(paper["row"] == "block cp=8") & (paper["metric"] == "max_time_s")]
    if len(pb):
        ax_b.axhline(float(pb["value"].iloc[0]), **paper_style("line"))
        ax_b.plot([], [], **paper_style("line"), label=f"{paper_label(pb['paper_hardware'].iloc[0])}: cp=8 max")
    ax_t.set(xscale="log", yscale="log", xlabel="global tokens", ylabel="TTT fwd+bwd (s; CPU: critical path)")
    ax_b.set(xscale="log", yscale="log", xlabel="global tokens", ylabel="block-draft fwd+bwd (s)")
    ax_m.set(xscale="log", yscale="log", xlabel="global tokens", ylabel="TTT peak memory per rank (GB)")
    # ticks at the measured lengths and at the paper's points, so every point drawn has its length on the axis
    paper_tokens = [tok for row_re, metric in (("ttt", "time_s"), ("ttt", "peak_mem_gb"))
                    for tok, _, _, _ in _paper_points(paper, rf"^{row_re} \d+K cp=\d+$", metric)]
    for ax in (ax_t, ax_b, ax_m):
        log_ticks_at(ax, [*cfg["tokens"], *(paper_tokens if ax is not ax_b else [])], fmt=_tok_label)
        plain_log_labels(ax, "y")
        legend_below(ax, fontsize=4.5)
    fig.suptitle(measured_title("Figure 6: draft-training attention at fixed global length", machines), fontsize=7)
    paths = save_figure(fig, out_dir / "fig6")
    notes = [("TTT: EAGLE-3, 3 passes, one document, fwd+bwd; trunk: the same passes without the branch keys; "
             "sdpa_cudnn: the same passes through SDPA's cuDNN kernel; all in the same run. Block: 64 anchors x 16 "
             "slots; block is the suite's route before flash-attn-4 (replicated segments on torch's flash kernel, "
             "replicas folded by torch scatters), block_sdpa the same with the Triton fold, block_flash4 / "
             "block_flash4_rep / block_fused the flash-attn-4 routes (masked call, replicated segments, one call "
             "for context and block), block_auto what auto picks by length, timed in the same run (speedup_vs_block). "
             "Qwen3-8B draft attention shape "
             "(32/8 heads, dim 128, bf16) on "
             "GPUs; CPU runs are cpu-emulated with scaled lengths and small heads (compare ratios only)."),
             "Peak memory includes the inputs; gradients are consumed as they arrive (freed after accumulation).",
             "CPU runs plot and compare the critical path (cpu_critical_s: largest per-rank CPU time per step)."]
    paths += write_table(summary_table(tidy, paper), out_dir / "fig6",
                         title="Figure 6: draft-training attention, measured vs paper", notes=notes)
    return paths
