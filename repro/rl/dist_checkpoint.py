"""Checkpoints of a distributed (PP x CP) co-training run (``repro.rl.dist_run``): one file per rank, committed by a
manifest.

At a checkpointed step every rank writes its part of the update (``MeshUpdate.state_dict``: its stage's parameters,
the draft on the last stage, its optimizer's moments, its RNG) to ``<out>/ckpt/dist/step<N>/rank<R>.pt``,
atomically. Once every rank has (a barrier), rank 0 replaces ``<out>/ckpt/dist/latest.json``, which names the step,
the layout, the run's config and its warm start's digest, and then removes the older step folders. A kill at any
moment leaves the last manifest and the files it names whole. Resuming needs the same layout (pp, cp, world); a
checkpoint from another config is refused naming the first differing key (or dropped with
``restart_on_config_change``) and one from another warm start is dropped, as ``repro.rl.checkpoint`` does for
single-process runs.

    save_rank(out, step, rank, upd.state_dict()); dist.barrier()       # every rank
    if rank == 0: commit(out, step, layout, cfg_dict, digest)
    step = resumable_step(out, layout, cfg_dict, digest)                # rank 0; None: start at step 0
    upd.load_state_dict(load_rank(out, step, rank))                     # every rank
    drop(out)                                                           # rank 0, once the run is finished
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from repro.core.io import write_atomic_with, write_json_atomic
from repro.core.specs import ConfigError
from repro.rl.checkpoint import config_difference, config_refusal

ROOT = Path("ckpt") / "dist"
MANIFEST = "latest.json"


def _step_dir(out: str | os.PathLike, step: int) -> Path:
    return Path(out) / ROOT / f"step{step}"


def save_rank(out: str | os.PathLike, step: int, rank: int, state: dict[str, Any]) -> None:
    """This rank's state after step ``step``, written atomically (not yet part of a checkpoint: see ``commit``)."""
    payload = {"step": int(step), "rank": int(rank), "rng": torch.get_rng_state(), **state}
    write_atomic_with(_step_dir(out, step) / f"rank{rank}.pt", lambda f: torch.save(payload, f))


def commit(out: str | os.PathLike, step: int, layout: dict[str, int], config: dict, warm_digest: str) -> None:
    """Rank 0, after every rank's ``save_rank`` of ``step`` (a barrier): make step ``step`` the checkpoint to resume
    from and remove the older ones."""
    root = Path(out) / ROOT
    write_json_atomic(root / MANIFEST, {"step": int(step), "layout": dict(layout), "config": config,
                                        "warm_start_digest": warm_digest})
    for old in root.glob("step*"):
        if old.is_dir() and old.name != f"step{step}":
            shutil.rmtree(old, ignore_errors=True)


def resumable_step(out: str | os.PathLike, layout: dict[str, int], config: dict, warm_digest: str,
                   restart_on_config_change: bool = False) -> int | None:
    """Rank 0: the step of the run folder's checkpoint to continue from, or None to start at step 0 (no checkpoint,
    or one that must not be continued, which is then dropped). Raises ConfigError for a checkpoint of another
    config (unless ``restart_on_config_change``) or another layout."""
    path = Path(out) / ROOT / MANIFEST
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    config = json.loads(json.dumps(config))        # as the manifest holds it (tuples are lists there)
    if manifest.get("warm_start_digest", "") != warm_digest:
        return _start_over(out, "from another warm start (its files changed since)")
    if (key := config_difference(manifest.get("config", {}), config)) is not None:
        if restart_on_config_change:
            return _start_over(out, f"of another config (key {key!r} changed)")
        raise config_refusal(path, key, manifest.get("config", {}), config)
    if manifest.get("layout") != dict(layout):
        raise ConfigError(f"checkpoint {path} was written by layout {manifest.get('layout')}, this run is {layout}: "
                          "every rank resumes its own part, so resume with the layout that wrote it (or use a fresh "
                          "--out)")
    step = int(manifest["step"])
    missing = [r for r in range(int(layout["world"])) if not (_step_dir(out, step) / f"rank{r}.pt").is_file()]
    if missing:
        raise ConfigError(f"checkpoint {path} names step {step}, whose files of ranks {missing} are missing from "
                          f"{_step_dir(out, step)}")
    return step


def load_rank(out: str | os.PathLike, step: int, rank: int) -> dict[str, Any]:
    """This rank's state of checkpoint ``step``; the RNG it was saved with is restored."""
    state = torch.load(_step_dir(out, step) / f"rank{rank}.pt", map_location="cpu", weights_only=False)
    torch.set_rng_state(state.pop("rng"))
    return state


def drop(out: str | os.PathLike) -> None:
    """Remove the run folder's distributed checkpoints (once its run.json marks it finished)."""
    shutil.rmtree(Path(out) / ROOT, ignore_errors=True)


def _start_over(out: str | os.PathLike, why: str) -> None:
    print(f"checkpoint {Path(out) / ROOT} continues a run {why}; dropping it and starting the run over",
          file=sys.stderr, flush=True)
    drop(out)
