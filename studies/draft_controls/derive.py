"""A profile with some settings changed, written as a .yaml file that every ``--profile`` option accepts.

    python -m studies.draft_controls.derive --profile cpu-tiny --out /tmp/p.yaml \
        rl.sft.workloads.workplace.draft_workload=math
The derived profile is validated by the profile model before it is written; a key path through a missing section
creates it, a value is parsed as YAML (``5``, ``1.0e-3``, ``true``, ``math``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from repro.core.io import write_atomic
from repro.core.profile import ProfileError, load_profile, parse_profile


def derive(profile: dict, settings: list[str]) -> dict:
    for item in settings:
        if "=" not in item:
            raise ProfileError(f"setting {item!r} is invalid: expected KEY.PATH=VALUE, e.g. rl.sft.steps=10")
        path, value = item.split("=", 1)
        node = profile
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ProfileError(f"setting {item!r}: {key!r} is not a section")
        node[leaf] = yaml.safe_load(value)
    parse_profile(profile, f"the derived profile ({', '.join(settings)})")
    return profile


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True, help="profile name, or a path to a profile .yaml file")
    ap.add_argument("--out", type=Path, required=True, help="the derived profile's .yaml file")
    ap.add_argument("settings", nargs="+", metavar="KEY.PATH=VALUE")
    args = ap.parse_args(argv)
    try:
        prof = derive(load_profile(args.profile), args.settings)
    except ProfileError as exc:
        print(f"derive: error: {exc}", file=sys.stderr)
        return 2
    write_atomic(args.out, yaml.safe_dump(prof, sort_keys=False))
    print(f"derive: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
