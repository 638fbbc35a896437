"""Checkpoints of a co-training run: policy, draft, optimizer, RNG state and the step, written atomically.

One file per run folder, ``<out>/ckpt/latest.pt``, replaced atomically after each checkpointed step,
so a crash leaves the previous checkpoint intact. The run's config is stored with it and a resume
refuses a checkpoint written under a different config (naming the first differing key).

    save_checkpoint(out, step, {"policy": ..., "draft": ..., "optimizer": ...}, cfg_dict)
    state = load_checkpoint(out, cfg_dict)        # None when the run has no checkpoint yet
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch

from repro.report.provenance import write_atomic

CKPT = Path("ckpt") / "latest.pt"
_IGNORED_KEYS = ("steps", "out", "ckpt_every")   # a resumed run may extend or relocate itself


def _comparable(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k not in _IGNORED_KEYS}


def save_checkpoint(out: str | os.PathLike, step: int, state: dict[str, Any], config: dict) -> Path:
    buf = io.BytesIO()
    torch.save({"step": int(step), "config": config, "rng": torch.get_rng_state(), **state}, buf)
    return write_atomic(Path(out) / CKPT, buf.getvalue())


def load_checkpoint(out: str | os.PathLike, config: dict) -> dict[str, Any] | None:
    path = Path(out) / CKPT
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    old, new = _comparable(state.get("config", {})), _comparable(config)
    if old != new:
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise ValueError(f"checkpoint {path} was written by a different config (first differing key "
                         f"{diff[0]!r}: {old.get(diff[0])!r} vs {new.get(diff[0])!r}); use a fresh --out")
    torch.set_rng_state(state["rng"])
    return state
