"""Figure 3: GRPO on single-turn math per training step, no-draft baseline and the three co-trained drafts.

Six panels from the per-step rows of the runs (collected tidy table, metric names ``train/*`` and
``val/*``): reward, held-out accuracy (AIME 2024's role), train-inference KL, acceptance length,
throughput (generated tokens per second of step) and step time (process CPU seconds on cpu-emulated
runs, as in the summary). The paper's reported values are
drawn dashed and labelled with the paper's hardware (the KL band on the KL panel); the summary
numbers beside the paper's go to ``fig3.md``/``.csv``. When the profile ran seed replicas of the
baseline row (``baseline_seeds``), the baseline's seed band is shaded behind the reward and accuracy
curves and each co-trained row's verdict (inside the band or not, acceptance trend) goes to
``fig3_spread.csv`` and into ``fig3.md`` (definitions: ``repro.report.seed_spread``).

    python -m repro.report.build --artifact fig3 --profile cpu-tiny \
        --tidy results/tidy/cpu-tiny/fig3.csv --out paper_figures/cpu-tiny
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from repro.report import seed_spread
from repro.report.collect import THIS_MACHINE, origin_of_label
from repro.report.style import measured_label, paper_label, paper_style, save_figure
from repro.report.tables import latest, to_markdown, warm_up_notes, write_table

ROWS = ["no draft", "EAGLE-3", "DFlash", "DSpark"]
PANELS = (("train/reward", "reward"), ("val/accuracy", "held-out accuracy"),
          ("train/train_inference_kl", "train-inference KL"), ("train/acceptance_length", "acceptance length"),
          ("train/throughput_tok_s", "throughput (tok/s)"), ("train/step_time_s", "step time (s)"))
# paper metric drawn on a panel: panel metric -> paper metric
PAPER_ON_PANEL = {"train/train_inference_kl": "train_inference_kl",
                  "train/acceptance_length": "acceptance_length_final"}
SUMMARY = ("train_inference_kl", "acceptance_length_final", "e2e_speedup", "rollout_speedup",
           "rollout_share_of_step_pct")


def _paper_range(paper: pd.DataFrame, metric: str) -> list[tuple[float, str]]:
    hit = paper[(paper["metric"] == metric)]
    return [(float(v), str(h)) for v, h in zip(hit["value"], hit["paper_hardware"])]


def summary_table(tidy: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """The summary metrics (row ``all`` and per family) beside the paper's values or ranges."""
    t = latest(tidy[tidy["metric"].isin(SUMMARY)])
    lines = []
    for (hw, label, row), g in t.groupby(["hardware", "hardware_label", "row"], sort=False):
        for _, r in g.iterrows():
            p = paper[(paper["row"] == row) & (paper["metric"] == r["metric"])]
            stats = dict(zip(p["stat"], p["value"]))
            ptxt = (f"{stats['min']:g}-{stats['max']:g}" if "min" in stats and "max" in stats
                    else f"{stats['value']:g}" if "value" in stats else "-")
            lines.append({"row": row, "metric": r["metric"], "measured": float(r["value"]),
                          "measured on": f"{hw} ({label})" if label else hw, "paper": ptxt,
                          "paper hardware": p["paper_hardware"].iloc[0] if len(p) else "-"})
    return pd.DataFrame(lines, columns=["row", "metric", "measured", "measured on", "paper", "paper hardware"])


KL_FLOOR = 1e-16


def _cpu_basis(steps: pd.DataFrame) -> pd.DataFrame:
    """On cpu-emulated runs: step time and throughput from process CPU seconds (shared cores make wall
    time noisy), under the panels' metric names, so the figure and the summary use one basis. Run by run: each
    derived row keeps its own run's machine, label and engine."""
    cpu_runs = set(steps.loc[steps["hardware_label"].str.startswith("cpu-emulated")
                             & (steps["metric"] == "train/step_cpu_s"), "run"])
    if not cpu_runs:
        return steps
    keys = ["run", "row", "step"]
    mine = steps[steps["run"].isin(cpu_runs)]
    cpu = mine[mine["metric"] == "train/step_cpu_s"].set_index(keys)["value"]
    tok = mine[mine["metric"] == "train/gen_tokens"].set_index(keys)["value"]
    rest = steps[~(steps["run"].isin(cpu_runs) & steps["metric"].isin(["train/step_time_s", "train/throughput_tok_s"]))]
    meta = mine.drop_duplicates("run").set_index("run")[["artifact", "profile", "hardware", "hardware_label",
                                                          "engine"]].to_dict("index")
    derived = []
    for (run, row, step), c in cpu.items():
        run_meta = meta[run]
        derived.append({**run_meta, "run": run, "row": row, "step": step, "metric": "train/step_time_s", "value": c})
        if (run, row, step) in tok.index and c > 0:
            derived.append({**run_meta, "run": run, "row": row, "step": step, "metric": "train/throughput_tok_s",
                            "value": tok[(run, row, step)] / c})
    return pd.concat([rest, pd.DataFrame(derived)], ignore_index=True)


def drawn_machine(steps: pd.DataFrame) -> tuple[str, str]:
    """(hardware, label) whose runs the figure draws: this machine's when it has runs, else the first listed."""
    pairs = list(dict.fromkeys(zip(steps["hardware"], steps["hardware_label"])))
    here = [p for p in pairs if origin_of_label(p[1]) == THIS_MACHINE]
    return (here or pairs)[0]


def build_curves(tidy: pd.DataFrame, paper: pd.DataFrame, out_dir: Path, name: str, title: str) -> list[Path]:
    """The six panels of one machine's runs (``drawn_machine``), the spread verdicts of every machine's runs and
    the summary of every machine's beside the paper's."""
    steps = tidy[tidy["metric"].str.startswith(("train/", "val/"))]
    steps = _cpu_basis(steps) if len(steps) else steps
    hw, label = drawn_machine(steps) if len(steps) else ("-", "")
    drawn = steps[(steps["hardware"] == hw) & (steps["hardware_label"] == label)] if len(steps) else steps
    cpu_basis = label.startswith("cpu-emulated") and (drawn["metric"] == "train/step_cpu_s").any()
    base = seed_spread.baseline_row(drawn) if len(drawn) else None
    hw_steps = drawn
    if base is not None:                           # the replicas the verdict table bands (sampling ones first)
        hw_steps, _ = seed_spread.banded_runs(hw_steps)
    curves = seed_spread.main_runs(drawn) if len(drawn) else drawn
    fig, axes = plt.subplots(2, 3, figsize=(7.0, 3.9))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()
    # one fixed style per row (a panel without the baseline, e.g. acceptance length, keeps the colours)
    styles = {row: {k: v[i % len(v)] for k, v in cycle.items()} for i, row in enumerate(ROWS)}
    for ax, (metric, ylabel) in zip(axes.flat, PANELS):
        window = seed_spread.SMOOTH.get(metric, 1)
        if base is not None and metric in dict(seed_spread.BAND_METRICS):
            b = seed_spread.band(hw_steps, base, metric)
            ax.fill_between(b["step"], b["lo"], b["hi"], color=styles.get(base, {}).get("color", "0.5"),
                            alpha=0.2, linewidth=0, label=f"{base}: {b['runs'].iloc[0]}-seed band "
                                                          f"(mean +- {seed_spread.K_SD:g} sd)")
        lowest = float("inf")                      # smallest value drawn (the KL panel's log axis starts below it)
        for row in ROWS:
            d = curves[(curves["row"] == row) & (curves["metric"] == metric)].sort_values(["run", "step"])
            d = d.groupby("step", as_index=False).last()
            if len(d):
                y = d["value"].clip(lower=KL_FLOOR) if metric == "train/train_inference_kl" else d["value"]
                if window > 1:
                    y = seed_spread.smooth(pd.Series(y.to_numpy(), index=d["step"]), window).to_numpy()
                ax.plot(d["step"], y, marker=".", markersize=3, label=row, **styles[row])
                lowest = min(lowest, float(pd.Series(y).min()))
        pm = PAPER_ON_PANEL.get(metric)
        if pm:
            for v, phw in _paper_range(paper, pm):
                ax.axhline(v, **paper_style("line"), label=paper_label(phw))
        ax.set_xlabel("step")
        if cpu_basis and metric in ("train/step_time_s", "train/throughput_tok_s"):
            ylabel = ylabel.replace("(s)", "(CPU s)").replace("tok/s", "tok/CPU s")
        if window > 1:
            ylabel = f"{ylabel} ({window}-step mean)"
        ax.set_ylabel(ylabel)
        if metric == "train/train_inference_kl":
            ax.set_yscale("log")
            ax.set_ylim(bottom=max(KL_FLOOR / 2, lowest / 10) if lowest < float("inf") else KL_FLOOR / 2)
    handles, labels = [], []
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    fig.legend(handles, labels, loc="upper center", ncol=min(6, len(labels)), frameon=False)
    fig.suptitle(f"{title}; {measured_label(hw, label)}", y=0.02, fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 0.92))
    paths = save_figure(fig, Path(out_dir) / name)
    notes = ["Row 'all': train-inference KL is the largest run mean; acceptance length, speedups are means over "
             "the drafted runs; rollout share is the no-draft run's rollout time over step time.",
             f"KL is drawn floored at {KL_FLOOR:g} (fp32 CPU runs are synced to rounding). On cpu-emulated runs "
             "step time and throughput are process CPU seconds (+ tool latency), the basis of the speedups."]
    notes += warm_up_notes(tidy)
    spread = (pd.concat([seed_spread.spread_table(steps), seed_spread.self_check_table(steps)], ignore_index=True)
              if len(steps) else pd.DataFrame(columns=seed_spread.TABLE_COLUMNS))
    if len(spread):
        paths += write_table(spread, Path(out_dir) / f"{name}_spread")
        notes += ["", "## Co-trained curves against the baseline's seed-to-seed spread", "",
                  to_markdown(spread).rstrip("\n"), ""] + seed_spread.NOTES
    else:
        notes += ["No seed replicas of the baseline row were run (profile key baseline_seeds): the co-trained "
                  "curves are not judged against a seed-to-seed spread."]
    return paths + write_table(summary_table(tidy, paper), Path(out_dir) / name, title=title, notes=notes)


def build(tidy: pd.DataFrame, paper: pd.DataFrame, out_dir: Path) -> list[Path]:
    return build_curves(tidy, paper, out_dir, "fig3", "Figure 3: co-training on single-turn math")
