"""Names of run folders, shared by the planner, the runs and the reports.

    run_dir_name("Qwen3-8B/DFlash")          # "qwen3-8b_dflash"
    replica_run_name("no_draft", 1)          # "no_draft_sampling1": the no-draft row again with sampling seed 1
"""
from __future__ import annotations

import re

SAMPLING = "sampling"


def run_dir_name(row: str) -> str:
    """Folder name of a row's run: ``"Qwen3-8B/DFlash"`` -> ``"qwen3-8b_dflash"``."""
    return re.sub(r"[^a-z0-9.-]+", "_", row.lower()).strip("_")


def replica_run_name(run_dir: str, seed: int) -> str:
    """Run folder of a baseline's sampling-seed replica: ``replica_run_name("no_draft", 1) -> "no_draft_sampling1"``."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"baseline seed {seed!r}: expected an integer >= 0")
    return f"{run_dir}_{SAMPLING}{seed}"
