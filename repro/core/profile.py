"""Hardware profiles (experiments/profiles/*.yaml): loading, schema validation, and the check that
this machine can serve a profile, done before any job runs.

    python -m repro.core.profile cpu-tiny          # validate and check against this machine
    python -m repro.core.profile --list
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml

from repro.core.provenance import REPO_ROOT, hardware

PROFILE_DIR = REPO_ROOT / "experiments" / "profiles"
SCHEMA_DIR = REPO_ROOT / "workflow" / "schemas"


class ProfileError(ValueError):
    """A profile that does not exist, does not validate, or that this machine cannot serve."""


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML ({exc})") from exc


def validate(instance: Any, schema_name: str, what: str) -> None:
    """Validate against workflow/schemas/<schema_name>; one-line error naming the bad key and value."""
    try:
        import jsonschema
    except ImportError:
        # Only on machines set up without the suite's dependencies (a lent GPU image); CI and
        # scripts/setup.sh environments always validate.
        warnings.warn(f"jsonschema is not installed: {what} not validated")
        return
    schema = load_yaml(SCHEMA_DIR / schema_name)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(instance), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        where = ".".join(str(p) for p in err.path) or "(top level)"
        raise ProfileError(f"{what}: {where}: {err.message}")


def load_profile(name: str) -> dict[str, Any]:
    path = PROFILE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ProfileError(f"unknown profile {name!r}; expected one of {', '.join(available_profiles())} "
                           f"(files in {PROFILE_DIR.relative_to(REPO_ROOT)})")
    profile = load_yaml(path)
    validate(profile, "profile.schema.yaml", f"profile file {path.relative_to(REPO_ROOT)}")
    if profile["name"] != name:
        raise ProfileError(f"{path}: name {profile['name']!r} does not match the file name {name!r}")
    return profile


def missing_hardware(profile: dict[str, Any], machine: dict[str, Any] | None = None) -> list[str]:
    """What this machine lacks to serve ``profile``; empty when it can."""
    machine = machine or hardware()
    need, missing = profile["hardware"], []
    gpus = machine["gpus"]["devices"]
    if need.get("gpus", 0) > len(gpus):
        have = f"{len(gpus)} ({gpus[0]['name']})" if gpus else "none"
        missing.append(f"{need['gpus']} GPU(s) (detected: {have})")
    model = need.get("gpu_model")
    if model and gpus and not all(model.lower() in g["name"].lower() for g in gpus[: need["gpus"]]):
        missing.append(f"GPU model {model} (detected: {gpus[0]['name']})")
    min_mem = need.get("min_gpu_memory_gb")
    if min_mem and gpus and min(g["memory_gb"] for g in gpus) < min_mem:
        missing.append(f"{min_mem} GB per GPU (detected: {min(g['memory_gb'] for g in gpus)} GB)")
    cores = machine["cpu"]["usable_cores"]
    if need.get("min_cpu_cores", 1) > cores:
        missing.append(f"{need['min_cpu_cores']} CPU cores (detected: {cores})")
    mem = machine["cpu"]["memory_gb"]
    if need.get("min_memory_gb", 0) > mem > 0:
        missing.append(f"{need['min_memory_gb']} GB of host memory (detected: {mem} GB)")
    return missing


def missing_paths(profile: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """Checkpoints (and the NeMo-RL checkout for the nemo-rl engine) that are not on local disk."""
    missing = []
    ckpts = profile.get("checkpoints") or {}
    root = config.get("checkpoint_root") or ""
    if ckpts and not root:
        missing.append(f"checkpoint_root (set --config checkpoint_root=/path holding {', '.join(ckpts.values())})")
    elif ckpts:
        for key, rel in ckpts.items():
            path = Path(root) / rel
            if not path.is_dir():
                missing.append(f"checkpoint {key}: {path} does not exist")
    if profile.get("engine") == "nemo-rl":
        nemo = config.get("nemo_rl_dir") or ""
        if not nemo:
            missing.append("nemo_rl_dir (set --config nemo_rl_dir=/path/to/your/NeMo-RL/checkout)")
        elif not (Path(nemo) / "nemo_rl").is_dir():
            missing.append(f"NeMo-RL checkout: {nemo} has no nemo_rl/ package")
    return missing


def check_servable(profile: dict[str, Any], config: dict[str, Any], *, jobs_run_here: bool = True) -> None:
    """Raise one ProfileError listing everything this machine lacks to serve ``profile``.

    With ``jobs_run_here=False`` (a cluster executor: jobs run on compute nodes, not on this login
    node) only the local paths are checked; the scheduler places the GPUs.
    """
    missing = (missing_hardware(profile) if jobs_run_here else []) + missing_paths(profile, config)
    if missing:
        raise ProfileError(f"profile {profile['name']!r} cannot run on this machine "
                           f"({hardware()['tag']}): missing " + "; ".join(missing))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", nargs="?", help="profile name (experiments/profiles/<name>.yaml)")
    ap.add_argument("--list", action="store_true", help="list the profiles")
    args = ap.parse_args(argv)
    if args.list or not args.profile:
        print("\n".join(available_profiles()))
        return 0
    try:
        check_servable(load_profile(args.profile), {})
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"profile {args.profile}: this machine ({hardware()['tag']}) can serve it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
