"""A profile with some settings changed, written as a .yaml file that every ``--profile`` option accepts.

Experiments that vary one setting (an SFT length, the drafts' warm-start workload) run on such a copy instead of
editing the profile. Values are read as YAML (``80`` is an integer, ``math`` a string); missing sections are made.

    python -m repro.rl.derive_profile --profile h200 --out /tmp/p.yaml rl.sft.workloads.workplace.steps=80
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from repro.report.profiles import ProfileError
from repro.rl.config import load_run_profile


def set_setting(profile: dict, dotted: str, value: Any) -> dict:
    """Set ``profile[a][b][c] = value`` for ``dotted = "a.b.c"`` in place (sections made as needed)."""
    *path, last = dotted.split(".")
    node = profile
    for key in path:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ValueError(f"setting {dotted!r}: {key!r} is not a section of the profile")
    node[last] = value
    return profile


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True, help="profile name, or a path to a profile .yaml file")
    ap.add_argument("--out", required=True, help="the derived profile's .yaml file")
    ap.add_argument("settings", nargs="+", metavar="KEY=VALUE", help="dotted key and YAML value, e.g. rl.sft.steps=80")
    args = ap.parse_args(argv)
    try:
        prof = load_run_profile(args.profile)
        for item in args.settings:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ValueError(f"setting {item!r}: expected KEY=VALUE, e.g. rl.sft.workloads.workplace.steps=80")
            set_setting(prof, key, yaml.safe_load(value))
    except (ValueError, ProfileError) as exc:
        print(f"derive_profile: error: {exc}", file=sys.stderr)
        return 2
    with open(args.out, "w") as f:
        yaml.safe_dump(prof, f, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
