"""collect: every run folder's metrics -> tidy tables under results/tidy/.

A run folder is any folder under results/ holding an ``env.json`` written by the suite's metrics logger; its rows
come from its ``metrics.jsonl`` (W&B is its mirror). W&B logs are read only for runs without one, such as other
engines' (offline ``wandb/*/run-*.wandb`` with the suite's own reader, or ``--online`` with ``wandb.Api``); a
per-engine mapper named in ``repro.core.handoffs`` turns their metric names into the suite's.

Where a run was measured: the folder given as ``--here`` holds this machine's runs; results/reference/<machine>/
holds runs committed from named machines (reference data). ``hardware_label`` says which (``cpu-emulated, this
machine``; ``gpu, reference``), so tables and figures draw the reference machines beside this one.

A run folder that cannot be read (a half-written env.json, a run killed before its logger closed, an unreadable
log) is named, skipped, and everything else is written; the exit status is then 1, naming every such folder.

Tidy schema (results/tidy/metrics.csv), one row per logged number:
    artifact, profile, hardware, hardware_label, run, engine, row, step, metric, value
and results/tidy/runs.csv, one row per run: run folder, artifact, profile, hardware, git sha, date, finished, ...

    python -m repro.report.collect --here results/cpu-2c-amd-epyc/cpu-tiny      # every run under results/
    python -m repro.report.collect --artifact table1 --profile cpu-tiny --tidy-file results/tidy/cpu-tiny/table1.csv
    python -m repro.report.collect --online me/rl-spec-repro --group table1
"""
from __future__ import annotations

import argparse
import io
import json
import math
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from repro.core.handoffs import METRIC_MAPPERS, metric_mapper
from repro.core.io import write_atomic
from repro.core.metrics import ENV, SIDECAR, read_sidecar
from repro.core.wandb_reader import WandbLogError, find_wandb_logs, read_wandb_log

TIDY_COLUMNS = ["artifact", "profile", "hardware", "hardware_label", "run", "engine", "row", "step",
                "metric", "value"]
RUN_COLUMNS = ["run", "artifact", "profile", "hardware", "hardware_label", "engine", "git_sha", "git_dirty",
               "date", "finished", "resumes", "source"]
REFERENCE = "reference"
THIS_MACHINE = "this machine"

# engine name -> function(history row) -> list of (row, metric, value). The suite's own runs log
# {"row": ..., "step": ..., <metric>: <value>}; an outside engine's mapper is named in repro.core.handoffs.
Mapper = Callable[[dict[str, Any]], list[tuple[str, str, float]]]


def suite_mapper(entry: dict[str, Any]) -> list[tuple[str, str, float]]:
    row = str(entry.get("row", ""))
    out = []
    for key, value in entry.items():
        if key in ("row", "step") or key.startswith("_"):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and math.isnan(value):
            continue
        out.append((row, key, float(value)))
    return out


class BadRunFolder(ValueError):
    """A run folder whose record cannot be read; the message names the folder and why."""


def _mapper(engine: str) -> Mapper:
    if engine == "suite":
        return suite_mapper
    if engine not in METRIC_MAPPERS:
        raise BadRunFolder(f"no metric mapper for engine {engine!r}; known: {['suite', *sorted(METRIC_MAPPERS)]}")
    return metric_mapper(engine)


def find_run_dirs(root: Path) -> list[Path]:
    """Run folders under ``root`` (those with an env.json), skipping the tidy output."""
    return sorted(p.parent for p in root.rglob(ENV) if "tidy" not in p.relative_to(root).parts)


def read_env(run_dir: Path) -> dict[str, Any]:
    env_path = run_dir / ENV
    try:
        return json.loads(env_path.read_text())
    except json.JSONDecodeError as exc:
        raise BadRunFolder(f"{env_path}: not valid JSON ({exc.msg}); half-written run folder?") from exc


def _history_of(run_dir: Path, env: dict[str, Any]) -> tuple[list[dict[str, Any]], bool, str]:
    """(history rows, finished, source) of one run folder: its sidecar, or its W&B logs when it has none."""
    sidecar = run_dir / SIDECAR
    if sidecar.is_file():
        try:
            rows = read_sidecar(sidecar)
        except ValueError as exc:
            raise BadRunFolder(str(exc)) from exc
        return rows, bool(env.get("finished", True)), SIDECAR
    logs = find_wandb_logs(run_dir)
    if not logs:
        raise BadRunFolder(f"{run_dir}: has neither {SIDECAR} nor a wandb/*/run-*.wandb log (killed before it "
                           "logged anything?)")
    rows, finished = [], False
    try:
        # Several logs = a resumed run; replay them in start order so later rows win on (row, step).
        for run in sorted((read_wandb_log(log) for log in logs), key=lambda r: r.start_time):
            rows.extend(run.history)
            finished = run.finished
    except WandbLogError as exc:
        raise BadRunFolder(f"{run_dir}: {exc}") from exc
    return rows, finished, "wandb-offline"


def tidy_rows(history: Iterable[dict[str, Any]], meta: dict[str, Any], mapper: Mapper) -> list[dict[str, Any]]:
    """One tidy row per (row, step, metric); a later entry wins (a resumed run logs a step again)."""
    latest: dict[tuple[str, int, str], float] = {}
    for i, entry in enumerate(history):
        step = int(entry.get("step", entry.get("_step", i)))
        for row, metric, value in mapper(entry):
            latest[(row, step, metric)] = value
    return [{**meta, "row": row, "step": step, "metric": metric, "value": value}
            for (row, step, metric), value in latest.items()]


def origin_of_label(hardware_label: str) -> str:
    """The origin part (``origin``'s word) of a tidy row's ``hardware_label`` such as ``cpu-emulated, this machine``."""
    return str(hardware_label).rpartition(", ")[2]


def origin(run_dir: Path, root: Path, here: Path | None) -> str:
    """``this machine`` (under --here), ``reference`` (results/reference/...) or ``local`` (another tag's folder)."""
    if here is not None and run_dir.resolve().is_relative_to(here.resolve()):
        return THIS_MACHINE
    return REFERENCE if REFERENCE in run_dir.resolve().relative_to(root.resolve().parent).parts else "local"


def collect_run(run_dir: Path, root: Path, env: dict[str, Any] | None = None, here: Path | None = None
                ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    env = read_env(run_dir) if env is None else env
    engine = env.get("engine") or env.get("config", {}).get("engine") or "suite"
    hw = env.get("hardware", {})
    label = ", ".join(x for x in (hw.get("label", ""), origin(run_dir, root, here)) if x)
    meta = {"artifact": env.get("artifact", ""), "profile": env.get("profile", ""), "hardware": hw.get("tag", ""),
            "hardware_label": label, "run": str(run_dir.relative_to(root)), "engine": engine}
    history, finished, source = _history_of(run_dir, env)
    if not finished:
        raise BadRunFolder(f"{run_dir}: its run did not finish (killed or failed; env.json finished: false): rerun "
                           "the workflow target that makes it, or delete the folder")
    if env.get("row"):   # engines that cannot log the paper row (NeMo-RL) name it in env.json
        history = [{"row": env["row"], **entry} for entry in history]
    info = {**meta, "git_sha": env.get("git", {}).get("sha", ""), "git_dirty": env.get("git", {}).get("dirty"),
            "date": env.get("date", ""), "finished": finished, "resumes": len(env.get("resumes", [])),
            "source": source}
    return tidy_rows(history, meta, suite_mapper if source == SIDECAR else _mapper(engine)), info


def collect(root: Path, artifact: str | None = None, profile: str | None = None, here: Path | None = None
            ) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Every readable run folder under ``root`` (optionally one artifact and/or profile) as tidy tables, and the
    problems of the folders that could not be read."""
    rows, runs, bad = [], [], []
    for run_dir in find_run_dirs(root):
        try:
            env = read_env(run_dir)
            # filter before reading any log: another artifact's run may be writing its log right now
            if (artifact and env.get("artifact", "") != artifact) or (profile and env.get("profile", "") != profile):
                continue
            r, info = collect_run(run_dir, root, env, here)
        except BadRunFolder as exc:
            print(f"collect: skipping {run_dir}: {exc}", file=sys.stderr, flush=True)
            bad.append(str(exc))
            continue
        rows.extend(r)
        runs.append(info)
    tidy = pd.DataFrame(rows, columns=TIDY_COLUMNS)
    tidy = tidy.sort_values(["artifact", "profile", "hardware", "run", "row", "step", "metric"], kind="stable")
    return tidy.reset_index(drop=True), pd.DataFrame(runs, columns=RUN_COLUMNS), bad


def collect_online(project: str, filters: dict[str, Any] | None = None, api=None) -> pd.DataFrame:
    """Read runs from a W&B server with ``scan_history`` (every row, unsampled)."""
    if api is None:
        import wandb
        api = wandb.Api()
    rows = []
    for run in api.runs(project, filters=filters or {}):
        cfg = dict(run.config)
        engine = cfg.get("engine", "suite")
        tags = {t.split(":", 1)[0]: t.split(":", 1)[1] for t in run.tags if ":" in t}
        meta = {"artifact": cfg.get("artifact", run.group), "profile": cfg.get("profile", tags.get("profile", "")),
                "hardware": cfg.get("hardware", tags.get("hw", "")), "hardware_label": "",
                "run": f"wandb:{project}/{run.id}", "engine": engine}
        history = run.scan_history()
        if cfg.get("row"):   # engines that cannot log the paper row (NeMo-RL) name it in the run config
            history = ({"row": cfg["row"], **entry} for entry in history)
        rows.extend(tidy_rows(history, meta, _mapper(engine)))
    return pd.DataFrame(rows, columns=TIDY_COLUMNS)


def write_csv(df: pd.DataFrame, path: Path) -> Path:
    buf = io.StringIO()
    df.to_csv(buf, index=False, lineterminator="\n")
    return write_atomic(path, buf.getvalue())


def read_tidy(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no collected metrics (run `snakemake collect` first)")
    df = pd.read_csv(path, dtype={"row": str, "run": str}, keep_default_na=False)
    missing = [c for c in TIDY_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing tidy columns {missing}; expected {TIDY_COLUMNS}")
    df["value"] = pd.to_numeric(df["value"])
    return df


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Collect every run folder's metrics into tidy tables.")
    ap.add_argument("--results", type=Path, default=Path("results"), help="results root (default: results)")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: <results>/tidy)")
    ap.add_argument("--here", type=Path, default=None,
                    help="the folder of this machine's runs (results/<machine>/<profile>); others are reference data")
    ap.add_argument("--online", metavar="ENTITY/PROJECT", help="read runs from a W&B server instead")
    ap.add_argument("--group", help="with --online: only runs of this group (artifact)")
    ap.add_argument("--artifact", help="only runs of this artifact")
    ap.add_argument("--profile", help="only runs of this profile")
    ap.add_argument("--tidy-file", type=Path, help="write only the tidy metrics, to this file")
    args = ap.parse_args(argv)
    out = args.out or args.results / "tidy"
    if args.online:
        tidy = collect_online(args.online, {"group": args.group} if args.group else None)
        write_csv(tidy, out / "metrics_online.csv")
        print(f"collect: {len(tidy)} metric values -> {out}")
        return 0
    tidy, runs, bad = collect(args.results, args.artifact, args.profile, args.here)
    if args.tidy_file:
        out = args.tidy_file
        write_csv(tidy, out)
    else:
        write_csv(tidy, out / "metrics.csv")
        write_csv(runs, out / "runs.csv")
    print(f"collect: {len(tidy)} metric values of {tidy['run'].nunique()} runs -> {out}")
    if bad:
        print(f"collect: error: {len(bad)} run folder(s) could not be read and were left out:\n  "
              + "\n  ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
