"""Report of a draft sweep (``studies.draft_controls.sweep``'s sweep.json): a Markdown table, a figure, \
the table as JSON.

For each (row, value of the swept ``DraftSpec`` field) one table line: acceptance length (AL) at steps 0 and 1,
its mean over all steps and over the last 4, its final value, the draft loss first -> last, the mean reward, the
final validation accuracy and the mean rollout time over steps >= 1 ("-" where an older sweep.json lacks them).
When the sweep compares exactly two values, a difference line per row: last-4-steps mean AL of the larger value
minus that of the smaller. The figure draws AL against step, one subplot per row, one line per value; several
sweep.json files (e.g. fig3 and fig4) share one report: a section each, a row of subplots each.

With --merge, sweeps run from one warm start (same profile, artifact, warm-start folder, seed and steps in their
provenance; e.g. scripts/device/shared_warmstart.sh's arms, a frozen arm and several lr arms) become one section whose
lines are labelled KEY=VALUE in input order, and each setting gets a difference line per row against the first
input's setting: its last-4 and all-steps mean AL minus the reference's.

    python -m studies.draft_controls.report results/cpu-2c/cpu-tiny/draft_frozen/fig3/sweep.json \\
        results/cpu-2c/cpu-tiny/draft_frozen/fig4/sweep.json --out-dir results/cpu-2c/cpu-tiny/draft_frozen \\
        --name report        # -> report.md, report.png, report.json (written atomically)
    python -m studies.draft_controls.report --merge D/loss_weight_0/sweep.json D/lr_5e-5/sweep.json \\
        D/lr_5e-4/sweep.json --out-dir D --name report      # frozen first: the reference

NAME defaults to the folder of the first sweep.json. Exit status 2 when an input is missing or is not a sweep.json.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path
from statistics import mean

from repro.core.io import write_atomic, write_json_atomic
from repro.core.provenance import provenance
from repro.report.seed_spread import slope_interval

LAST = 4  # steps averaged for "AL last 4"
MERGED_KEY = "setting"  # the label column of merged sweeps: KEY=VALUE
SAME_START = ("profile", "artifact", "warm_start", "seed", "steps")  # provenance config fields merged sweeps share
EXPECTED = ('a JSON object with "key" (the swept DraftSpec field) and a non-empty "runs" list '
            '(studies.draft_controls.sweep)')
COLUMNS = ["row", None, "AL step 0", "AL step 1", "AL mean", f"AL last {LAST}", "AL final", "AL slope/step [95% CI]",
           "draft loss first -> last", "mean reward", "final val acc", "rollout s (steps >= 1)"]


class SweepError(Exception):
    pass


def load_sweep(path: str) -> dict:
    """The sweep.json at ``path``, checked to have what the report reads; SweepError naming the file if not."""
    p = Path(path)
    if not p.is_file():
        raise SweepError(f"{path}: no such file; expected a sweep.json written by studies.draft_controls.sweep")
    try:
        sweep = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SweepError(f"{path}: not readable JSON ({exc}); expected {EXPECTED}") from None
    if not isinstance(sweep, dict) or not isinstance(sweep.get("key"), str) or not sweep.get("runs") \
            or not isinstance(sweep["runs"], list):
        raise SweepError(f"{path}: expected {EXPECTED}")
    for i, run in enumerate(sweep["runs"]):
        if not isinstance(run, dict) or "row" not in run or sweep["key"] not in run \
                or not run.get("acceptance_length"):
            raise SweepError(f'{path}: runs[{i}] lacks "row", "{sweep["key"]}" or a non-empty "acceptance_length"')
    return sweep


def merge_sweeps(paths: list[str], sweeps: list[dict]) -> dict:
    """One sweep of runs labelled KEY=VALUE (input order kept), from sweeps of one warm start; SweepError naming
    the first input that differs from the first sweep in a SAME_START field of its provenance config."""
    ref = (sweeps[0].get("provenance") or {}).get("config") or {}
    missing = [f for f in SAME_START if f not in ref]
    if missing:
        raise SweepError(f"{paths[0]}: provenance config lacks {missing}; --merge needs {list(SAME_START)} to check "
                         "that the sweeps share one warm start")
    runs = []
    for path, sweep in zip(paths, sweeps):
        config = (sweep.get("provenance") or {}).get("config") or {}
        for f in SAME_START:
            if config.get(f) != ref[f]:
                raise SweepError(f"{path}: {f} is {config.get(f)!r}, expected {ref[f]!r} as in {paths[0]}; "
                                 "--merge compares sweeps from one warm start")
        runs += [{**r, MERGED_KEY: f"{sweep['key']}={r[sweep['key']]}"} for r in sweep["runs"]]
    complete = [s.get("complete") for s in sweeps]
    return {"key": MERGED_KEY, "runs": runs, "provenance": sweeps[0].get("provenance"),
            "complete": None if None in complete else all(complete)}


def against_reference(table: list[dict]) -> list[dict]:
    """Per row and setting after the first: its last-4 and all-steps mean AL minus the first setting's."""
    ref = table[0][MERGED_KEY]
    by = {(t["row"], t[MERGED_KEY]): t for t in table}
    return [{"row": t["row"], "setting": t[MERGED_KEY], "reference": ref,
             "al_last4_difference": t["al_last4"] - by[t["row"], ref]["al_last4"],
             "al_mean_difference": t["al_mean"] - by[t["row"], ref]["al_mean"]}
            for t in table if t[MERGED_KEY] != ref and (t["row"], ref) in by]


def summarize(run: dict, key: str) -> dict:
    """One table line of a run, as data (None where the sweep.json has no such curve)."""
    al = run["acceptance_length"]
    loss = [x for x in run.get("draft_loss") or [] if x is not None]
    reward = run.get("reward") or []
    val = run.get("val_accuracy") or []
    rollout = (run.get("rollout_time_s") or [])[1:]  # step 0 includes warm-up and compilation
    return {"row": run["row"], key: run[key], "al_step0": al[0], "al_step1": al[1] if len(al) > 1 else None,
            "al_mean": mean(al), "al_last4": mean(al[-LAST:]), "al_final": al[-1], "steps": len(al),
            **dict(zip(("al_slope", "al_slope_low", "al_slope_high"), slope_interval(range(len(al)), al))),
            "draft_loss_first": loss[0] if loss else None, "draft_loss_last": loss[-1] if loss else None,
            "mean_reward": mean(reward) if reward else None,
            "final_val_accuracy": val[-1][1] if val else None,
            "mean_rollout_time_s": mean(rollout) if rollout else None}


def differences(table: list[dict], key: str) -> list[dict]:
    """Per row, last-4 mean AL of the larger value minus the smaller; only for a sweep of exactly two values."""
    values = sorted({t[key] for t in table})
    if len(values) != 2:
        return []
    by = {(t["row"], t[key]): t["al_last4"] for t in table}
    rows = dict.fromkeys(t["row"] for t in table)
    return [{"row": r, "larger": values[1], "smaller": values[0],
             "al_last4_difference": by[r, values[1]] - by[r, values[0]]}
            for r in rows if (r, values[0]) in by and (r, values[1]) in by]


def fmt(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def slope_cell(t: dict) -> str:
    """The AL slope per step and its 95% bootstrap interval over the steps (repro.report.seed_spread)."""
    if t.get("al_slope") is None or t["al_slope"] != t["al_slope"]:      # absent, or NaN (< 3 steps)
        return "-"
    return f"{t['al_slope']:+.4f} [{t['al_slope_low']:+.4f}, {t['al_slope_high']:+.4f}]"


def where(prov: dict) -> str:
    hw = prov.get("hardware") or {}
    return f"{hw.get('tag', 'unknown hardware')} ({hw.get('label', 'unlabelled')})"


def section(path: str, sweep: dict, table: list[dict], diffs: list[dict]) -> str:
    key, prov = sweep["key"], sweep.get("provenance") or {}
    git, config = prov.get("git") or {}, prov.get("config") or {}
    values = ", ".join(str(v) for v in (dict.fromkeys(t[key] for t in table) if key == MERGED_KEY
                                        else sorted({t[key] for t in table})))
    state = {True: "dirty", False: "clean"}.get(git.get("dirty"), "dirty: unknown")
    done = {True: "complete", False: "INCOMPLETE"}.get(sweep.get("complete"), "completeness not recorded")
    what = ", ".join(f"{k} {config[k]}" for k in ("profile", "artifact") if config.get(k))
    varied = (f"draft settings {values}, from one warm start" if key == MERGED_KEY
              else f"draft.{key} varied over {values}")
    header = (f"{varied} ({what}; {done}), measured on {where(prov)}, "
              f"git {git.get('sha', 'unknown')[:12]} ({state}), {prov.get('date', 'date unknown')}")
    lines = [f"## {path}", "", header, "",
             "| " + " | ".join(c or key for c in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for t in table:
        loss = f"{fmt(t['draft_loss_first'])} -> {fmt(t['draft_loss_last'])}"
        cells = [t["row"], t[key], fmt(t["al_step0"]), fmt(t["al_step1"]), fmt(t["al_mean"]), fmt(t["al_last4"]),
                 fmt(t["al_final"]), slope_cell(t), loss, fmt(t["mean_reward"]), fmt(t["final_val_accuracy"]),
                 fmt(t["mean_rollout_time_s"], ".2f")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if diffs:
        lines.append("")
    for d in diffs:
        if key == MERGED_KEY:
            lines.append(f"- {d['row']}, {d['setting']} minus {d['reference']}: AL last {LAST} "
                         f"{d['al_last4_difference']:+.3f}, AL mean {d['al_mean_difference']:+.3f}")
        else:
            lines.append(f"- difference, {d['row']}: AL last {LAST}, {key}={d['larger']} minus {key}={d['smaller']}: "
                         f"{d['al_last4_difference']:+.3f}")
    return "\n".join(lines) + "\n"


def figure_png(inputs: list[tuple[str, dict, list[dict]]]) -> bytes:
    """AL against step: a row of subplots (one per sweep row) per input, one line per value; PNG bytes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from repro.report.style import apply_style
    apply_style()
    rows = [list(dict.fromkeys(r["row"] for r in sweep["runs"])) for _, sweep, _ in inputs]
    ncols = max(len(r) for r in rows)
    fig, axes = plt.subplots(len(inputs), ncols, sharey="row", squeeze=False,
                             figsize=(2.1 * ncols + 0.9, 1.75 * len(inputs) + 0.35), layout="constrained")
    for i, (path, sweep, _) in enumerate(inputs):
        key, name = sweep["key"], Path(path).parent.name
        for j, ax in enumerate(axes[i]):
            if j >= len(rows[i]):
                ax.set_visible(False)
                continue
            runs = [r for r in sweep["runs"] if r["row"] == rows[i][j]]
            if key != MERGED_KEY:
                runs.sort(key=lambda r: r[key])
            for r in runs:
                al = r["acceptance_length"]
                ax.plot(range(len(al)), al, label=r[key] if key == MERGED_KEY else f"{key}={r[key]}")
            ax.set_title(f"{name}: {rows[i][j]}" if len(inputs) > 1 else rows[i][j])
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if j == 0:
                ax.set_ylabel("acceptance length")
        axes[i][len(rows[i]) - 1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), handlelength=2.5)
    hardware = ", ".join(dict.fromkeys(where(s.get("provenance") or {}) for _, s, _ in inputs))
    keys = ", ".join(dict.fromkeys("draft settings" if s["key"] == MERGED_KEY else f"draft.{s['key']}"
                                   for _, s, _ in inputs))
    fig.suptitle(f"Acceptance length per step, {keys} varied; measured on {hardware}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.draft_controls.report", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("sweeps", nargs="+", metavar="SWEEP_JSON", help="sweep.json files of studies.draft_controls.sweep")
    ap.add_argument("--out-dir", required=True, help="folder for NAME.md, NAME.png and NAME.json")
    ap.add_argument("--name", default="", help="file stem of the report (default: folder of the first sweep.json)")
    ap.add_argument("--merge", action="store_true",
                    help="one section of all inputs' runs (one warm start), differences against the first input")
    args = ap.parse_args(argv)
    name = args.name or Path(args.sweeps[0]).resolve().parent.name
    out = Path(args.out_dir) / name
    outputs = [out.with_suffix(s).resolve() for s in (".md", ".png", ".json")]
    try:
        sweeps = [load_sweep(p) for p in args.sweeps]
        clash = [p for p in args.sweeps if Path(p).resolve() in outputs]
        if clash:
            raise SweepError(f"{clash[0]}: is also an output of --out-dir/--name; expected another --name")
        labels = args.sweeps
        if args.merge:
            folders = [os.path.dirname(os.path.abspath(p)) for p in args.sweeps]
            common = os.path.commonpath(folders)
            label = os.path.relpath(common) + ": " + ", ".join(os.path.relpath(f, common) for f in folders)
            sweeps, labels = [merge_sweeps(args.sweeps, sweeps)], [label]
    except SweepError as exc:
        print(f"sweep_report: error: {exc}", file=sys.stderr)
        return 2
    inputs, md, records = [], [f"# Draft sweep report: {name}", ""], []
    for path, sweep in zip(labels, sweeps):
        table = [summarize(r, sweep["key"]) for r in sweep["runs"]]
        diffs = against_reference(table) if args.merge else differences(table, sweep["key"])
        inputs.append((path, sweep, table))
        md.append(section(path, sweep, table, diffs))
        records.append({"path": path, "key": sweep["key"], "complete": sweep.get("complete"), "table": table,
                        "differences": diffs, "provenance": sweep.get("provenance")})
    md.append(f"AL: acceptance length per verify step; AL last {LAST}: its mean over the last {LAST} steps; "
              "rollout s: mean rollout time over steps >= 1 (step 0 includes warm-up).\n")
    png = figure_png(inputs)
    write_atomic(out.with_suffix(".md"), "\n".join(md))
    write_atomic(out.with_suffix(".png"), png)
    write_json_atomic(out.with_suffix(".json"), {"name": name, "inputs": records,
                                                 "provenance": provenance({"sweeps": args.sweeps, "merge": args.merge,
                                                                           "out_dir": args.out_dir, "name": name})})
    print(f"[sweep_report] {len(sweeps)} sweep(s) -> {out}.md, .png, .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
