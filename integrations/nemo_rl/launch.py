"""The launch command of one NeMo-RL row: local ``uv run`` in the user's checkout, or SLURM via ray.sub.

Both launchers run the same two steps in the NeMo-RL checkout, with W&B and Hugging Face pointed at
the run folder and the local caches:
  1. ``integrations.nemo_rl.runtime_env``: record the machine that actually runs NeMo-RL in env.json;
  2. NeMo-RL's entry script (examples/run_grpo.py, or examples/nemo_gym/run_grpo_nemo_gym.py) on the
     generated config.
``local`` runs them here (one node: inside a Snakemake SLURM-executor job, or on a GPU box).
``ray-sub`` submits NeMo-RL's own ray.sub (it starts a Ray cluster across the nodes of the
allocation and runs the steps on the head node) with ``sbatch --wait``, so the call returns when the
run ends. The command is one shell line: what --dry-run prints is exactly what runs.

    python -m integrations.nemo_rl.run --list --profile paper-gb200      # the ray-sub commands of the GB200 rows
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from integrations.nemo_rl.config import CONFIG_NAME, Paths
from integrations.nemo_rl.rows import RowSpec
from repro.core.provenance import REPO_ROOT

LAUNCHERS = ("local", "ray-sub")
RAY_LOG_DIR_NAME = "ray_logs"


@dataclass(frozen=True)
class Slurm:
    """sbatch settings for ray.sub (its #SBATCH account/partition lines are placeholders: give both)."""
    container: str | None = None
    account: str | None = None
    partition: str | None = None
    time: str = "4:00:00"


def default_launcher(spec: RowSpec) -> str:
    return "local" if spec.layout.nodes == 1 else "ray-sub"


def _q(value: str | Path) -> str:
    return shlex.quote(str(value))


def _shown(path: Path | None, flag: str) -> str:
    """A path, or a visible placeholder naming the flag that sets it (used by --list)."""
    return str(path) if path is not None else f"<{flag}>"


def run_env(paths: Paths, run_dir: Path) -> dict[str, str]:
    """Environment of the NeMo-RL process: W&B into the run folder (offline unless the user chose
    online), Hugging Face offline from the local cache."""
    env = {"WANDB_MODE": os.environ.get("WANDB_MODE", "offline"), "WANDB_DIR": str(run_dir),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if paths.hf_home is not None:
        env["HF_HOME"] = str(paths.hf_home)
    return env


def steps(spec: RowSpec, paths: Paths, run_dir: Path) -> str:
    """The two steps, as one shell line run from the NeMo-RL checkout."""
    exports = " ".join(f"{k}={_q(v)}" for k, v in run_env(paths, run_dir).items())
    return (f"cd {_q(_shown(paths.nemo_rl_dir, 'nemo-rl-dir'))} && export {exports}"
            f" && PYTHONPATH={_q(REPO_ROOT)} uv run python -m integrations.nemo_rl.runtime_env {_q(run_dir)}"
            f" && uv run python {_q(spec.workload.entry)} --config {_q(run_dir / CONFIG_NAME)}")


def _mounts(paths: Paths, run_dir: Path) -> str:
    dirs = [p for p in (paths.nemo_rl_dir, paths.checkpoint_root, paths.hf_home, paths.dataset_root, run_dir,
                        REPO_ROOT) if p is not None]
    dirs = sorted({Path(d) for d in dirs}, key=lambda d: len(d.parts))
    kept = [d for i, d in enumerate(dirs) if not any(d.is_relative_to(e) for e in dirs[:i])]
    return ",".join(f"{d}:{d}" for d in sorted(kept))


def job_name(spec: RowSpec) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"repro-{spec.artifact}-{spec.row}")


def command(spec: RowSpec, paths: Paths, run_dir: Path, launcher: str, slurm: Slurm | None = None) -> str:
    """The full launch command of a row (one shell line)."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher {launcher!r}; expected one of {', '.join(LAUNCHERS)}")
    run_dir = Path(run_dir).resolve()
    if launcher == "local":
        return steps(spec, paths, run_dir)
    slurm = slurm or Slurm()
    lay = spec.layout
    sbatch = [f"--nodes={lay.nodes}", f"--gres=gpu:{lay.gpus_per_node}",
              f"--account={slurm.account or '<slurm-account>'}",
              f"--partition={slurm.partition or '<slurm-partition>'}",
              f"--time={slurm.time}", f"--job-name={job_name(spec)}", "--wait"]
    env = {"COMMAND": steps(spec, paths, run_dir), "CONTAINER": slurm.container or "<container>",
           "MOUNTS": _mounts(paths, run_dir), "GPUS_PER_NODE": str(lay.gpus_per_node),
           "BASE_LOG_DIR": str(run_dir / RAY_LOG_DIR_NAME)}
    return (f"cd {_q(_shown(paths.nemo_rl_dir, 'nemo-rl-dir'))} && mkdir -p {_q(run_dir / RAY_LOG_DIR_NAME)} && "
            + " ".join(f"{k}={_q(v)}" for k, v in env.items()) + " sbatch " + " ".join(sbatch) + " ray.sub")
