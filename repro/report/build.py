"""Build one artifact's tables and figures from its collected (tidy) data and the paper's numbers.

Each artifact has a module ``repro.report.artifacts.<artifact>`` exposing
``build(tidy, paper, out_dir) -> list[Path]``; it reads nothing but those two tables and never
re-runs an experiment, so figures regenerate anywhere, without a GPU.

    python -m repro.report.build --artifact fig5 --profile cpu-tiny \
        --tidy results/tidy/cpu-tiny/fig5.csv --out paper_figures/cpu-tiny
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from repro.report.collect import read_tidy
from repro.report.paper import ARTIFACTS, load_paper_numbers
from repro.report.style import apply_style


def build(artifact: str, tidy_path: Path, out_dir: Path, profile: str | None = None) -> list[Path]:
    module = importlib.import_module(f"repro.report.artifacts.{artifact}")
    tidy = read_tidy(tidy_path)
    if profile:
        tidy = tidy[tidy["profile"] == profile]
    if tidy.empty:
        raise ValueError(f"{tidy_path}: no measurements for {artifact}"
                         + (f" on profile {profile}" if profile else ""))
    paper = load_paper_numbers()
    apply_style()
    return module.build(tidy, paper[paper["artifact"] == artifact], out_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build an artifact's tables and figures from collected data.")
    ap.add_argument("--artifact", required=True, choices=ARTIFACTS + ("decode",),
                    help="a paper artifact, or decode (the suite's decoding benchmark)")
    ap.add_argument("--tidy", type=Path, required=True, help="tidy metrics CSV (from collect)")
    ap.add_argument("--out", type=Path, required=True, help="output folder (paper_figures/<profile>)")
    ap.add_argument("--profile", help="only measurements of this profile")
    args = ap.parse_args(argv)
    try:
        paths = build(args.artifact, args.tidy, args.out, args.profile)
    except (FileNotFoundError, ValueError) as exc:
        print(f"build: error: {exc}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
