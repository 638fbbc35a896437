"""publish: this machine's finished runs of a profile as reference data, for other clones to draw beside theirs.

Copies every finished run folder under ``--runs`` (results/<machine>/<label>/) into ``--out``
(results/reference/<machine>/<label>/), leaving out what is rebuilt or too large for git (checkpoints, warm-start
weights, W&B's own files), and writes a README there: what was measured, on which machine, from which commit, and
the command that reproduces it. The copy is built beside the destination and swapped in at the end, so an
interrupted publish leaves the previous reference data as it was.

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


def finished_runs(root: Path) -> list[Path]:
    """Run folders under ``root`` whose logger closed cleanly (env.json finished: true)."""
    out = []
    for env in sorted(root.rglob(ENV)):
        if SKIP_DIRS & set(env.relative_to(root).parts):
            continue
        try:
            if json.loads(env.read_text()).get("finished", False):
                out.append(env.parent)
        except json.JSONDecodeError:
            continue
    return out


def _copy_tree(src: Path, dst: Path) -> None:
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if SKIP_DIRS & set(rel.parts) or path.suffix in SKIP_SUFFIXES or not path.is_file():
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dst / rel)


def readme(runs: list[Path], root: Path, label: str) -> str:
    envs = [json.loads((r / ENV).read_text()) for r in runs]
    artifacts = Counter(e.get("artifact", "?") for e in envs)
    hw = envs[0]["hardware"] if envs else {}
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


def publish(runs_root: Path, out: Path) -> list[Path]:
    runs = finished_runs(runs_root)
    if not runs:
        raise FileNotFoundError(f"{runs_root}: no finished run folder to publish (run the profile's targets first)")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for run in runs:
            _copy_tree(run, stage / run.relative_to(runs_root))
        write_atomic(stage / "README.md", readme(runs, runs_root, out.name))
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if out.exists():
            out.rename(old)
        stage.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Copy this machine's finished runs into results/reference/.")
    ap.add_argument("--runs", type=Path, required=True, help="this machine's runs: results/<machine>/<label>")
    ap.add_argument("--out", type=Path, required=True, help="results/reference/<machine>/<label>")
    args = ap.parse_args(argv)
    try:
        runs = publish(args.runs, args.out)
    except FileNotFoundError as exc:
        print(f"publish: error: {exc}", file=sys.stderr)
        return 2
    print(f"publish: {len(runs)} run folders -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
