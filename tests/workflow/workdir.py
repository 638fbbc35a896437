"""A copy of the workflow (Snakefile, rules, config, profiles) in a temporary folder, and a tiny profile for it, so
workflow tests run real jobs without touching the checkout's results/."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from repro.core.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]


def tiny_profile() -> dict:
    """cpu-tiny cut to a few seconds of work per job: table1 with a no-draft and a DFlash row, 4 steps."""
    prof = load_profile("cpu-tiny")
    keep = {"name", "description", "hardware", "dtype", "workload_scale", "engine", "checkpoints", "envcheck", "rl"}
    prof = {k: v for k, v in prof.items() if k in keep}
    prof["name"] = "tiny-test"
    prof["envcheck"] = {"matmul_size": 64, "matmul_repeats": 1, "copy_mb": 1, "copy_repeats": 1}
    rl = prof["rl"]
    rl["sft"] = {"steps": 6, "batch": 4, "lr": 3.0e-3, "draft_steps": 4}
    rl["grpo"].update(prompts_per_step=2, generations_per_prompt=2, max_new_tokens=8, microbatch=4)
    rl["workload"] = {"name": "math", "val_every": 2, "val_size": 2}
    rl["ckpt_every"] = 1
    rl["drafts"] = {"dflash": rl["drafts"]["dflash"]}
    prof["table1"] = {"steps": 4, "skip_steps": 1, "rows": {
        "Qwen3-8B/no draft": {"policy": "dense"},
        "Qwen3-8B/DFlash": {"policy": "dense", "draft": "dflash", "baseline": "Qwen3-8B/no draft"}}}
    return prof


class Workdir:
    """A workflow copy: ``run(*args)`` runs snakemake there (this machine's tag fixed to ``machine``)."""

    def __init__(self, path: Path, machine: str = "test-machine", *, copy_of: Path | None = None):
        self.path, self.machine = path, machine
        if copy_of is not None:                       # another workflow copy with everything it made
            shutil.copytree(copy_of, path, symlinks=True)
        else:
            path.mkdir(parents=True, exist_ok=True)
            for item in ("Snakefile", "workflow", "profiles"):
                src = ROOT / item
                (shutil.copytree if src.is_dir() else shutil.copy2)(src, path / item)
            (path / "tiny.yaml").write_text(yaml.safe_dump(tiny_profile(), sort_keys=False))
        self.env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1",
                    "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "snakemake", "-c1", *args, "--config", "profile=tiny.yaml",
                f"machine={self.machine}"]

    def clone(self, path: Path) -> Workdir:
        """A copy of this workflow folder, outputs included, at ``path``."""
        return Workdir(path, self.machine, copy_of=self.path)

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(self.cmd(*args), cwd=self.path, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    @property
    def runs(self) -> Path:
        return self.path / "results" / self.machine / "tiny-test"
