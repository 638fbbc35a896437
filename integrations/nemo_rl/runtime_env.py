"""Record, in a NeMo-RL run folder's env.json, the machine that actually runs NeMo-RL.

integrations.nemo_rl.run writes env.json where the run is generated (a login node when submitting to
SLURM); the launch command's first step runs this module on the node that runs NeMo-RL (inside the
NeMo-RL environment, with the suite on PYTHONPATH) and replaces the hardware, software and date with
what it detects there. The node count of a multi-node allocation is read from SLURM and prefixed to
the hardware tag (``8n-4xgb200``). Standard library and repro.core.provenance only, so it runs in
NeMo-RL's environment.

    PYTHONPATH=/path/to/suite uv run python -m integrations.nemo_rl.runtime_env results/.../table1/Qwen3-8B_DFlash
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from repro.core.io import write_json_atomic
from repro.core.provenance import provenance


def runtime_env(env: dict[str, Any], detected: dict[str, Any], nodes: int) -> dict[str, Any]:
    """``env`` with the detected provenance; the generating machine kept under ``generated_on``."""
    hw = dict(detected["hardware"])
    if nodes > 1:
        hw.update(nodes=nodes, tag=f"{nodes}n-{hw['tag']}")
    before = env.get("hardware", {})
    return {**env, **{k: v for k, v in detected.items() if k != "config"}, "hardware": hw,
            "generated_on": {"tag": before.get("tag"), "hostname": before.get("hostname"), "date": env.get("date")}}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m integrations.nemo_rl.runtime_env RUN_DIR", file=sys.stderr)
        return 2
    path = Path(args[0]) / "env.json"
    try:
        env = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"runtime_env: error: {path}: {exc} (generate the run folder with integrations.nemo_rl.run first)",
              file=sys.stderr)
        return 2
    nodes_text = os.environ.get("SLURM_JOB_NUM_NODES", "1")
    if not nodes_text.isdigit():
        print(f"runtime_env: error: SLURM_JOB_NUM_NODES={nodes_text!r} is not a node count", file=sys.stderr)
        return 2
    write_json_atomic(path, runtime_env(env, provenance(env.get("config")), int(nodes_text)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
