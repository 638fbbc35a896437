"""Checkpoints of a co-training run: policy, draft, optimizer, RNG state and the step, written atomically.

One file per run folder, ``<out>/ckpt/latest.pt``, replaced atomically after each checkpointed step, so a crash
leaves the previous checkpoint intact; a finished run drops it (``drop_checkpoint``: policy, draft and optimizer
state are several GB per run at one-GPU scale, and nothing reads a finished run's). The run's config is stored with
it and a resume refuses a checkpoint written under a different config (naming the first differing key). The digest
of the warm-start files the run started from is stored too: a checkpoint whose warm start has since been rebuilt
(same path, other weights) is stale, so it is dropped and the run starts over.

A run saves through a ``CheckpointWriter``: the state is copied to host memory on the training thread and written
by a worker thread (at one-GPU scale, policy, fp32 master weights and Adam moments are about 6 GB: serializing and
syncing them stalled every checkpointed step for seconds). The write runs while the run validates, logs and starts
its next step's bookkeeping; a timed training step first waits for every write in flight in the process
(``wait_for_writes``): a write that overlapped a timed step slowed it (an update of 0.83 s against 0.15 s in the
lockstep step right after another row's checkpoint, on one H100), and in a lockstep process one row's write
overlaps the next row's step.

    writer = CheckpointWriter(out)
    writer.save(step, {"policy": ..., "draft": ..., "optimizer": ...}, cfg_dict, warm_digest)   # returns at once
    wait_for_writes()                                      # before a timed step: no write of the process in flight
    writer.close()                                         # end of run: the last write landed, or its error raised
    state = load_checkpoint(out, cfg_dict, warm_digest)   # None: no checkpoint yet, or a stale one dropped
"""
from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from repro.core.io import write_atomic_with
from repro.core.specs import ConfigError

CKPT = Path("ckpt") / "latest.pt"
# one checkpoint write at a time in a process: lockstep rows checkpoint at the same steps, and concurrent writes
# would hold every row's old file and new temp file on disk at once (4 rows x 2 x ~6 GB on the h200 profile)
_ONE_WRITE = threading.Lock()
_IGNORED_KEYS = ("steps", "out", "ckpt_every")   # a resumed run may extend or relocate itself
_IN_FLIGHT: list[threading.Thread] = []           # every writer's worker threads in this process, until joined


def wait_for_writes() -> float:
    """Block until every checkpoint write started in this process has landed (any writer's); returns the seconds
    waited. A failed write is not raised here but by its own writer's ``wait``/``close``."""
    t0 = time.perf_counter()
    while _IN_FLIGHT:
        _IN_FLIGHT.pop().join()
    return time.perf_counter() - t0


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


class CheckpointWriter:
    """Checkpoints of one run folder, written in the background. ``save`` snapshots every tensor of the state into
    host buffers (kept from the previous save when the shapes match; pinned when the tensors live on a GPU, so the
    copy is one asynchronous transfer each and a single sync), starts a worker thread that serializes the snapshot
    and replaces ``<out>/ckpt/latest.pt`` atomically, and returns. One write at a time: ``save`` first waits for the
    one before, and the writes of all writers in a process run one after another. ``wait`` blocks until the last
    write landed and re-raises what the worker raised; ``close`` (end of run) also frees the host buffers, so a
    finished run's checkpoint is never written after it was dropped."""

    def __init__(self, out: str | os.PathLike):
        self.out = Path(out)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._host: list[torch.Tensor] = []

    def save(self, step: int, state: dict[str, Any], config: dict, warm_digest: str = "") -> None:
        self.wait()
        payload = {"step": int(step), "config": config, "rng": torch.get_rng_state(), "warm_start_digest": warm_digest,
                   **self._snapshot(state)}
        self._thread = threading.Thread(target=self._run, args=(payload,), name=f"checkpoint {self.out}")
        self._thread.start()
        _IN_FLIGHT[:] = [t for t in _IN_FLIGHT if t.is_alive()] + [self._thread]

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"writing checkpoint {self.out / CKPT} failed: {error}") from error

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._host = []

    def _run(self, payload: dict[str, Any]) -> None:
        try:
            with _ONE_WRITE:
                write_atomic_with(self.out / CKPT, lambda f: torch.save(payload, f))
        except BaseException as e:     # re-raised on the training thread by wait()
            self._error = e

    def _snapshot(self, state: dict[str, Any]) -> dict[str, Any]:
        """The state with every tensor replaced by a host copy; tensors that share memory (tied embeddings) share
        one copy, as torch.save would store them."""
        leaves, spec = tree_flatten(state)
        index: dict[tuple, int] = {}   # (data_ptr, dtype, shape, stride, device) -> position in unique
        unique: list[torch.Tensor] = []
        order: list[int] = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                key = (leaf.data_ptr(), leaf.dtype, tuple(leaf.shape), leaf.stride(), leaf.device)
                if key not in index:
                    index[key] = len(unique)
                    unique.append(leaf.detach())
                order.append(index[key])
        if [(h.shape, h.dtype) for h in self._host] != [(t.shape, t.dtype) for t in unique]:
            self._host = [torch.empty(t.shape, dtype=t.dtype, device="cpu",
                                      pin_memory=t.is_cuda) for t in unique]
        for host, t in zip(self._host, unique):
            host.copy_(t, non_blocking=t.is_cuda)
        if any(t.is_cuda for t in unique):
            torch.cuda.synchronize()
        it = iter(order)
        return tree_unflatten([self._host[next(it)] if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves],
                              spec)


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
    if (key := config_difference(state.get("config", {}), config)) is not None:
        if restart_on_config_change:
            return _start_over(path, f"of another config (key {key!r} changed)")
        raise config_refusal(path, key, state.get("config", {}), config)
    torch.set_rng_state(state["rng"])
    return state


def config_difference(old: dict, new: dict) -> str | None:
    """The first key (in name order) whose value differs between a checkpoint's config and the run's, ignoring the
    keys a resumed run may change (its steps, folder, checkpoint period); None if they agree."""
    old, new = _comparable(old), _comparable(new)
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return diff[0] if diff else None


def config_refusal(path: Path, key: str, old: dict, new: dict) -> ConfigError:
    return ConfigError(f"checkpoint {path} was written by a different config (first differing key {key!r}: "
                       f"{old.get(key)!r} vs {new.get(key)!r}); use a fresh --out, or --restart-on-config-change "
                       "to start this run over")
