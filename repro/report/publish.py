"""publish: this machine's finished runs of a profile as reference data, for other clones to draw beside theirs.

Copies the artifacts finished under ``--runs`` (results/<machine>/<label>/) into ``--out``
(results/reference/<machine>/<label>/). An artifact is a top folder of ``--runs`` (table1/, fig6/, sft/, ...) holding
at least one finished run: a run whose env.json says finished: true, or an SFT warm start with its sft.json (the
job's last write; its first is the tokenizer/ folder). It is copied whole, less its unfinished runs and what is
rebuilt or too large for git (checkpoints, warm-start weights, W&B's own files).

By default the reference's other artifacts stay, so a machine that ran only some targets publishes those. An
artifact replaced by another commit's run keeps its summary (summary/summary.json or bench.json) in logs/ as
``<artifact>-<sha7>.<name>``, named by the commit that measured it. ``--replace`` makes the folder this machine's
runs alone. Where the folder has no README, or the one this tool wrote there, one is written: what was measured,
on which machine, from which commit, and how to reproduce it; a README edited by hand is kept (say in it what
changed). The copy is built beside the destination and swapped in at the end, so an interrupted publish leaves the
previous reference data as it was.

    python -m repro.report.publish --runs results/cpu-2c-amd-epyc/cpu-tiny \\
        --out results/reference/cpu-2c-amd-epyc/cpu-tiny
    snakemake publish --config profile=cpu-tiny          # the same, after the profile's artifacts are up to date
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

from repro.core.io import write_atomic
from repro.core.metrics import ENV

SKIP_DIRS = {"ckpt", "wandb", "__pycache__"}
SKIP_SUFFIXES = (".pt", ".tmp", ".lock")
SUMMARIES = ("summary/summary.json", "bench.json")   # an artifact's summary, kept in logs/ when it is replaced
WARM_START_DONE, WARM_START_BEGUN = "sft.json", "tokenizer"   # an SFT warm start's last and first writes
LOGS = "logs"


def _env(path: Path) -> dict:
    """A run's env.json, or {} where it cannot be read (a half-written run folder counts as unfinished)."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _finished(env: Path) -> bool:
    return bool(_env(env).get("finished", False))


def _skipped(rel: Path) -> bool:
    return bool(SKIP_DIRS & set(rel.parts)) or rel.suffix in SKIP_SUFFIXES


def finished_runs(root: Path) -> list[Path]:
    """Run folders under ``root`` whose logger closed cleanly (env.json finished: true), and finished SFT warm
    starts (sft.json)."""
    runs = {env.parent for env in root.rglob(ENV) if not _skipped(env.relative_to(root)) and _finished(env)}
    runs |= {done.parent for done in root.rglob(WARM_START_DONE) if not _skipped(done.relative_to(root))}
    return sorted(runs)


def unfinished_runs(root: Path) -> list[Path]:
    """Run folders under ``root`` that did not finish: env.json not finished, or a warm start without sft.json."""
    runs = [env.parent for env in root.rglob(ENV) if not _finished(env)]
    return runs + [begun.parent for begun in root.rglob(WARM_START_BEGUN)
                   if begun.is_dir() and not (begun.parent / WARM_START_DONE).is_file()]


def finished_artifacts(root: Path) -> dict[str, list[Path]]:
    """Top folders of ``root`` holding at least one finished run -> those runs."""
    out: dict[str, list[Path]] = {}
    for run in finished_runs(root):
        if run == root:
            continue
        out.setdefault(run.relative_to(root).parts[0], []).append(run)
    return out


def _copy_artifact(src: Path, dst: Path) -> None:
    """``src`` into ``dst``, less the skipped paths and the folders of runs that did not finish."""
    unfinished = unfinished_runs(src)
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if _skipped(rel) or not path.is_file() or any(u in path.parents for u in unfinished):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dst / rel)


def _run_info(run: Path) -> dict:
    """A finished run's provenance: its env.json, or for an SFT warm start its sft.json's (artifact "sft")."""
    if (run / ENV).is_file():
        return _env(run / ENV)
    return {"artifact": "sft", **_env(run / WARM_START_DONE).get("provenance", {})}


def _measured_by(folder: Path) -> str:
    """The commit (7 hex digits) that measured an artifact folder, from its runs' provenance."""
    shas = (_run_info(run).get("git", {}).get("sha") for run in finished_runs(folder))
    return next((sha[:7] for sha in shas if sha), "unknown")


def _keep_summary(old: Path, logs: Path, artifact: str) -> None:
    """The replaced artifact's summary into ``logs/<artifact>-<sha7>.<name>`` (the first of SUMMARIES it has)."""
    for name in SUMMARIES:
        if (old / name).is_file():
            logs.mkdir(parents=True, exist_ok=True)
            shutil.copy2(old / name, logs / f"{artifact}-{_measured_by(old)}.{Path(name).name}")
            return


def readme(runs: list[Path], root: Path, label: str) -> str:
    envs = [_run_info(r) for r in runs]
    artifacts = Counter(e.get("artifact", "?") for e in envs)
    hw = next((e["hardware"] for e in envs if "hardware" in e), {})
    gpus = hw.get("gpus", {}).get("devices", [])
    cpu = f"{hw.get('cpu', {}).get('model', '?')} ({hw.get('cpu', {}).get('usable_cores', '?')} cores)"
    machine = f"{len(gpus)}x {gpus[0]['name']}, host {cpu}" if gpus else f"{cpu}, no GPU (cpu-emulated)"
    shas = Counter(e.get("git", {}).get("sha", "unknown")[:10] + (" (dirty)" if e.get("git", {}).get("dirty") else "")
                   for e in envs)
    dates = sorted(e.get("date", "") for e in envs)
    profile = label.split("-suite")[0].split("-nemo-rl")[0]
    targets = " ".join(a for a in ("envcheck", "table1", "table2", "fig3", "fig4", "fig5", "fig6", "fig7", "decode")
                       if a in artifacts)
    lines = [f"# Reference runs: profile {label} on {hw.get('tag', '?')}", "",
             f"Measured on {machine} by the workflow, between {dates[0] if dates else '?'} and "
             f"{dates[-1] if dates else '?'}.", "",
             "| artifact | run folders |", "|---|---|",
             *[f"| {a} | {n} |" for a, n in sorted(artifacts.items())], "",
             "Commit of the runs: " + ", ".join(f"`{s}` ({n} run{'s' * (n != 1)})" for s, n in shas.most_common())
             + ".", "",
             "Reproduce on your machine (results land in `results/<your machine>/`, these stay as reference):", "",
             "```bash", f"snakemake -c all {targets} --config profile={profile}", "```", "",
             "Each folder holds env.json (provenance, config), metrics.jsonl (every logged row) and, for benchmarks, "
             "bench.json (raw samples); checkpoints and weights are left out."]
    return "\n".join(lines) + "\n"


def publish(runs_root: Path, out: Path, replace: bool = False) -> dict[str, list[Path]]:
    """Copy the finished artifacts of ``runs_root`` into ``out`` (merged into it unless ``replace``); returns them."""
    artifacts = finished_artifacts(runs_root)
    if not artifacts:
        raise FileNotFoundError(f"{runs_root}: no finished run folder to publish (run the profile's targets first)")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        generated = False
        if out.is_dir() and not replace:
            shutil.copytree(out, stage, dirs_exist_ok=True)
            kept = stage / "README.md"
            generated = kept.is_file() and kept.read_text() == readme(finished_runs(stage), stage, out.name)
        for artifact in artifacts:
            old = stage / artifact
            if old.is_dir():
                if _measured_by(old) != _measured_by(runs_root / artifact):
                    _keep_summary(old, stage / LOGS, artifact)
                dropped = sorted({r.relative_to(stage) for r in finished_runs(old)}
                                 - {r.relative_to(runs_root) for r in artifacts[artifact]})
                if dropped:
                    print(f"publish: {artifact}: the reference's runs {[str(d) for d in dropped]} are not among "
                          "this machine's finished runs and are dropped with the artifact it replaces",
                          file=sys.stderr)
                shutil.rmtree(old)
            _copy_artifact(runs_root / artifact, stage / artifact)
        if generated or not (stage / "README.md").exists():         # one this tool wrote is rewritten
            write_atomic(stage / "README.md", readme(finished_runs(stage), stage, out.name))
        else:
            print(f"publish: {out / 'README.md'} kept: say there which commit measured {sorted(artifacts)}",
                  file=sys.stderr)
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if out.exists():
            out.rename(old)
        stage.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return artifacts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Copy this machine's finished artifacts into results/reference/, "
                                             "keeping the reference's other artifacts unless --replace.")
    ap.add_argument("--runs", type=Path, required=True, help="this machine's runs: results/<machine>/<label>")
    ap.add_argument("--out", type=Path, required=True, help="results/reference/<machine>/<label>")
    ap.add_argument("--replace", action="store_true",
                    help="make --out this machine's finished runs alone (default: replace only the artifacts "
                         "finished here, keeping the others and their logs)")
    args = ap.parse_args(argv)
    try:
        artifacts = publish(args.runs, args.out, replace=args.replace)
    except FileNotFoundError as exc:
        print(f"publish: error: {exc}", file=sys.stderr)
        return 2
    n = sum(len(r) for r in artifacts.values())
    print(f"publish: {', '.join(sorted(artifacts))} ({n} finished run folders) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
