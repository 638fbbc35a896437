"""compare: measured values next to the paper's, per artifact, with an expected ratio from the ceilings.

For every number of experiments/paper_numbers.csv the report gives: metric, unit, paper hardware and
value, measured hardware and value, ratio (measured / paper), the expected ratio, and a status.

Expected ratio: what the ratio should be if only the hardware differed. Dimensionless metrics
(speedups, acceptance lengths, percentages, memory in GB) expect 1.0. Times and bandwidths that scale
with a ceiling (``scales_with``: flops, mem_bw, p2p_bw) expect the ratio of the paper hardware's
datasheet ceiling (experiments/hardware/paper_hardware.yaml) to this machine's measured one (envcheck),
inverted for times; on a profile whose workload is scaled down (cpu-tiny, h200) absolute times have no
expected ratio and say so. Artifacts without a measurement yet say so plainly.

The index opens with how this machine stands against the paper, artifact by artifact: how many of the paper's
numbers it measured, and how many meet, are within 10% of, or fall short of the paper (ranges: within or not).

    python -m repro.report.compare --profile cpu-tiny --tidy results/tidy/metrics.csv --machine cpu-2c-amd-epyc \
        --env results/cpu-2c-amd-epyc/cpu-tiny/envcheck/bench.json --out paper_figures/cpu-tiny/comparison
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from repro.core.io import write_atomic
from repro.core.profile import ProfileError, load_profile
from repro.core.provenance import REPO_ROOT
from repro.report.collect import REFERENCE, read_tidy
from repro.report.paper import ARTIFACTS, load_paper_numbers
from repro.report.tables import to_markdown, write_table

PAPER_HARDWARE = REPO_ROOT / "experiments" / "hardware" / "paper_hardware.yaml"
COLUMNS = ["row", "metric", "unit", "paper_hardware", "paper_value", "measured_hardware", "measured_value",
           "ratio", "expected_ratio", "status"]


def paper_hw_key(paper_hardware: str) -> str | None:
    keys = [k for k in ("GB200", "H100") if k in paper_hardware]
    return keys[0] if len(keys) == 1 else None


def expected_ratio(number: dict[str, Any], profile: dict[str, Any], ceilings: dict[str, Any] | None,
                   paper_hw: dict[str, Any]) -> tuple[float | None, str]:
    """(expected measured/paper ratio, reason when there is none)."""
    scales = number["scales_with"]
    if scales == "none":
        return 1.0, ""
    if profile["workload_scale"] != "paper":
        return None, "scaled workload"
    if not ceilings:
        return None, "no envcheck"
    key = paper_hw_key(number["paper_hardware"])
    if key is None or key not in paper_hw:
        return None, f"no ceilings for {number['paper_hardware']}"
    if scales == "flops":
        ours, theirs = ceilings.get("matmul_tflops"), paper_hw[key]["matmul_tflops"].get(profile["dtype"])
    else:
        name = "copy_bw_gbps" if scales == "mem_bw" else "p2p_bw_gbps"
        ours, theirs = ceilings.get(name), paper_hw[key][name]
    if not ours or not theirs:
        return None, f"no measured {scales} ceiling"
    faster = ours / theirs   # >1: this machine has the higher ceiling
    return (1.0 / faster if not number["higher_is_better"] else faster), ""


def _status(measured: float, lo: float, hi: float | None, exp: float | None, higher_better: bool,
            is_range: bool, why: str) -> str:
    if is_range:
        if lo <= measured <= hi:
            return "within paper range"
        return "above paper range" if measured > hi else "below paper range"
    if exp is None:
        return f"measured (no expected ratio: {why})"
    q = (measured / lo) / exp if lo else math.inf
    if not higher_better:
        q = 1.0 / q if q else math.inf
    # q >= 1: at least as good as the paper after the hardware is accounted for.
    if q >= 1.0:
        return "meets or beats paper"
    return "within 10% of paper" if q >= 0.9 else "short of paper"


def compare_artifact(artifact: str, tidy: pd.DataFrame, paper: pd.DataFrame, profile: dict[str, Any],
                     ceilings: dict[str, Any] | None, paper_hw: dict[str, Any]) -> pd.DataFrame:
    numbers = paper[paper["artifact"] == artifact]
    measured = tidy[(tidy["artifact"] == artifact) & (tidy["profile"] == profile["name"])]
    lines = []
    for (row, metric), grp in numbers.groupby(["row", "metric"], sort=False):
        first = grp.iloc[0].to_dict()
        stats = dict(zip(grp["stat"], grp["value"]))
        is_range = "min" in stats and "max" in stats
        lo = stats.get("min", stats.get("value"))
        hi = stats.get("max") if is_range else None
        paper_text = f"{lo:g}-{hi:g}" if is_range else f"{lo:g}"
        exp, why = expected_ratio(first, profile, ceilings, paper_hw)
        hits = measured[(measured["row"] == row) & (measured["metric"] == metric)]
        base = {"row": row, "metric": metric, "unit": first["unit"], "paper_hardware": first["paper_hardware"],
                "paper_value": paper_text}
        if hits.empty:
            lines.append({**base, "measured_hardware": "-", "measured_value": None, "ratio": None,
                          "expected_ratio": exp, "status": "no measurement yet"})
            continue
        for (hw, label), h in hits.groupby(["hardware", "hardware_label"], sort=True):
            h = h.sort_values(["run", "step"], kind="stable")
            value = float(h["value"].iloc[-1])
            ratio = None if is_range or lo == 0 else value / lo
            lines.append({**base, "measured_hardware": f"{hw} ({label})" if label else hw,
                          "measured_value": value, "ratio": ratio, "expected_ratio": exp,
                          "status": _status(value, lo, hi, exp, bool(first["higher_is_better"]), is_range, why)})
    return pd.DataFrame(lines, columns=COLUMNS)


def machine_line(env: dict[str, Any] | None) -> str:
    """The machine the envcheck run (bench.json) measured, and its ceilings."""
    if not env:
        return "Machine: unknown (no envcheck run)"
    env = {**env["provenance"], "ceilings": env.get("summary", {}).get("ceilings", {})}
    hw, sw = env["hardware"], env["software"]
    gpus = hw["gpus"]["devices"]
    gpu = f"{len(gpus)}x {gpus[0]['name']}" if gpus else "no GPU (cpu-emulated)"
    c = env.get("ceilings", {})
    ceil = (f" | matmul {c['matmul_tflops']:.3g} TFLOP/s ({c['dtype']}), copy {c['copy_bw_gbps']:.3g} GB/s"
            if c.get("matmul_tflops") else "")
    return (f"Machine: {hw['tag']} | {hw['cpu']['model']} ({hw['cpu']['usable_cores']} cores) | {gpu} | "
            f"torch {sw.get('torch')} | git {env['git']['sha'][:10]}{' (dirty)' if env['git'].get('dirty') else ''}"
            f"{ceil}")


def standing(tables: dict[str, pd.DataFrame], machine: str | None) -> pd.DataFrame:
    """How this machine stands against the paper, artifact by artifact (its rows only when ``machine`` is given: a
    committed reference run of the same machine tag is not this machine's)."""
    lines = []
    for artifact, table in tables.items():
        mine = table[table["measured_value"].notna()]
        if machine:
            hw = mine["measured_hardware"]
            mine = mine[hw.str.startswith(machine) & ~hw.str.endswith(f", {REFERENCE})")]
        count = mine["status"].value_counts()
        lines.append({"artifact": artifact, "paper numbers": len(table.drop_duplicates(["row", "metric"])),
                      "measured here": len(mine),
                      "meets or beats": int(count.get("meets or beats paper", 0)),
                      "within 10%": int(count.get("within 10% of paper", 0)),
                      "short": int(count.get("short of paper", 0)),
                      "in / out of paper range":
                          f"{int(count.get('within paper range', 0))} / "
                          f"{int(count.get('above paper range', 0) + count.get('below paper range', 0))}",
                      "no expected ratio": int(mine["status"].str.startswith("measured (no expected").sum())})
    return pd.DataFrame(lines)


def write_reports(profile_name: str, tidy: pd.DataFrame, env: dict[str, Any] | None, out: Path,
                  artifacts: tuple[str, ...] = ARTIFACTS, machine: str | None = None) -> list[Path]:
    profile = load_profile(profile_name)
    paper = load_paper_numbers()
    paper_hw = yaml.safe_load(PAPER_HARDWARE.read_text())
    ceilings = (env or {}).get("summary", {}).get("ceilings")
    header = machine_line(env)
    written, index, tables = [], [], {}
    for artifact in artifacts:
        table = compare_artifact(artifact, tidy, paper, profile, ceilings, paper_hw)
        tables[artifact] = table
        n_measured = int(table["measured_value"].notna().sum())
        notes = [header, "",
                 "ratio = measured / paper. expected ratio = the ratio if only the hardware differed "
                 "(1.0 for dimensionless metrics; from the ceilings for times and bandwidths). "
                 "Paper values are the paper's own, on the paper's hardware; never measured here."]
        if n_measured == 0:
            notes.insert(0, f"**No measurement yet for {artifact} on profile {profile_name}.**")
        written += write_table(table, out / artifact, title=f"{artifact}: measured ({profile_name}) vs paper",
                               notes=notes)
        logged = int(((tidy["artifact"] == artifact) & (tidy["profile"] == profile_name)).sum())
        state = ("measured" if n_measured else
                 "measured, but no row matches a paper number at this scale" if logged else "no measurement yet")
        index.append({"artifact": artifact, "paper_numbers": len(table), "compared": n_measured,
                      "values_logged": logged, "state": state})
    idx = pd.DataFrame(index)
    where = f"this machine ({machine})" if machine else "every machine"
    summary = to_markdown(standing(tables, machine), title=f"How {where} stands against the paper, profile "
                          f"{profile_name}", notes=[header, "", "Statuses account for the hardware through the "
                          "expected ratio (README, compare); scaled workloads compare dimensionless numbers only."])
    detail = to_markdown(idx, title="Every machine's measurements",
                         notes=["Per-artifact reports: <artifact>.md / <artifact>.csv beside this file; reference "
                                "machines' rows are labelled 'reference'."])
    written.append(write_atomic(out / "index.md", summary + "\n" + detail))
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write comparison reports (measured vs paper) per artifact.")
    ap.add_argument("--profile", required=True, help="profile the measurements were made with")
    ap.add_argument("--tidy", type=Path, required=True, help="collected metrics (results/tidy/metrics.csv)")
    ap.add_argument("--env", type=Path, help="this machine's envcheck bench.json (its ceilings)")
    ap.add_argument("--machine", help="this machine's tag: the index opens with its standing")
    ap.add_argument("--out", type=Path, required=True, help="output folder for the reports")
    ap.add_argument("--artifacts", nargs="*", default=list(ARTIFACTS), choices=ARTIFACTS)
    args = ap.parse_args(argv)
    try:
        tidy = read_tidy(args.tidy)
        env = json.loads(args.env.read_text()) if args.env else None
        paths = write_reports(args.profile, tidy, env, args.out, tuple(args.artifacts), args.machine)
    except (FileNotFoundError, ValueError, ProfileError) as exc:
        print(f"compare: error: {exc}", file=sys.stderr)
        return 2
    print(f"compare: {len(paths)} files -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
