"""`repro`: a thin command line over the Snakemake workflow and the suite's tools.

    repro reproduce table1 fig5 --profile h200 -c 8     # = snakemake -c8 table1 fig5 --config profile=h200
    repro profiles                                        # list profiles and whether this machine serves them
    repro env                                             # this machine's provenance as JSON
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from repro.core.profile import ProfileError, available_profiles, load_profile, missing_hardware
from repro.core.provenance import REPO_ROOT, provenance


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="repro", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("reproduce", help="run Snakemake targets (table1, table2, fig3..fig7, compare, all)")
    rp.add_argument("targets", nargs="+")
    rp.add_argument("--profile", default="cpu-tiny", choices=available_profiles())
    rp.add_argument("-c", "--cores", default="all")
    rp.add_argument("-n", "--dry-run", action="store_true")
    sub.add_parser("profiles", help="list profiles and what this machine lacks for each")
    sub.add_parser("env", help="print this machine's provenance")
    args = ap.parse_args(argv)
    if args.command == "reproduce":
        cmd = [sys.executable, "-m", "snakemake", f"--cores={args.cores}", *args.targets,
               "--config", f"profile={args.profile}"] + (["-n"] if args.dry_run else [])
        return subprocess.call(cmd, cwd=REPO_ROOT)
    if args.command == "profiles":
        for name in available_profiles():
            try:
                missing = missing_hardware(load_profile(name))
            except ProfileError as exc:
                missing = [str(exc)]
            print(f"{name:12s} {'ok' if not missing else 'missing: ' + '; '.join(missing)}")
        return 0
    print(json.dumps(provenance(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
