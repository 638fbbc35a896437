"""Checkpoints of a co-training run: policy, draft, optimizer, RNG state and the step, written atomically.

One file per run folder, ``<out>/ckpt/latest.pt``, replaced atomically after each checkpointed step, so a crash
leaves the previous checkpoint intact; a finished run drops it (``drop_checkpoint``: policy, draft and optimizer
state are several GB per run at one-GPU scale, and nothing reads a finished run's). The run's config is stored with
it and a resume refuses a checkpoint written under a different config (naming the first differing key). The digest
of the warm-start files the run started from is stored too: a checkpoint whose warm start has since been rebuilt
(same path, other weights) is stale, so it is dropped and the run starts over.

    save_checkpoint(out, step, {"policy": ..., "draft": ..., "optimizer": ...}, cfg_dict, warm_digest)
    state = load_checkpoint(out, cfg_dict, warm_digest)   # None: no checkpoint yet, or a stale one dropped
"""
from __future__ import annotations

import hashlib
import io
import os
import sys
from pathlib import Path
from typing import Any

import torch

from repro.core.io import write_atomic
from repro.core.specs import ConfigError

CKPT = Path("ckpt") / "latest.pt"
_IGNORED_KEYS = ("steps", "out", "ckpt_every")   # a resumed run may extend or relocate itself


def _comparable(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k not in _IGNORED_KEYS}


def warm_start_digest(warm_start: str | os.PathLike) -> str:
    """sha256 over the warm start's weight files (policy.pt, drafts/*.pt), in name order; "" for none."""
    if not warm_start:
        return ""
    root = Path(warm_start)
    h = hashlib.sha256()
    for f in sorted([root / "policy.pt", *sorted((root / "drafts").glob("*.pt"))]):
        if f.is_file():
            h.update(str(f.relative_to(root)).encode())
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 24), b""):
                    h.update(block)
    return h.hexdigest()


def save_checkpoint(out: str | os.PathLike, step: int, state: dict[str, Any], config: dict,
                    warm_digest: str = "") -> Path:
    buf = io.BytesIO()
    torch.save({"step": int(step), "config": config, "rng": torch.get_rng_state(), "warm_start_digest": warm_digest,
                **state}, buf)
    return write_atomic(Path(out) / CKPT, buf.getvalue())


def drop_checkpoint(out: str | os.PathLike) -> None:
    """Remove the run folder's checkpoint (once its run.json marks it finished)."""
    (Path(out) / CKPT).unlink(missing_ok=True)


def _start_over(path: Path, why: str) -> None:
    """Drop a checkpoint that must not be continued, saying why; the run starts at step 0."""
    print(f"checkpoint {path} continues a run {why}; dropping it and starting the run over", file=sys.stderr,
          flush=True)
    path.unlink()


def load_checkpoint(out: str | os.PathLike, config: dict, warm_digest: str = "",
                    restart_on_config_change: bool = False) -> dict[str, Any] | None:
    """The run folder's checkpoint to continue, or None. One from another warm start is dropped; one from another
    config is refused, or dropped with ``restart_on_config_change`` (the workflow's reruns after a profile change,
    which regenerate the run's outputs anyway)."""
    path = Path(out) / CKPT
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    old_digest = state.get("warm_start_digest", warm_digest)     # checkpoints from before digests: trusted
    if old_digest != warm_digest:
        return _start_over(path, "from another warm start (its files changed since)")
    old, new = _comparable(state.get("config", {})), _comparable(config)
    if old != new:
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if restart_on_config_change:
            return _start_over(path, f"of another config (key {diff[0]!r} changed)")
        raise ConfigError(f"checkpoint {path} was written by a different config (first differing key "
                          f"{diff[0]!r}: {old.get(diff[0])!r} vs {new.get(diff[0])!r}); use a fresh --out, or "
                          "--restart-on-config-change to start this run over")
    torch.set_rng_state(state["rng"])
    return state
