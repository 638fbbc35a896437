"""The one metrics logger of every experiment: ``metrics.jsonl`` in the run folder, mirrored to W&B.

A run lives in its own folder ``results/<machine>/<profile>/<artifact>/<run>/``:
    env.json         provenance (hardware, versions, git, date), the run's config, and ``finished``: false while
                     the run is going, true once its logger closed without an error; ``resumes`` lists restarts
    metrics.jsonl    one JSON object per logged row, appended and flushed row by row: the source of truth
    wandb/           W&B's own files (offline by default): a mirror for W&B's tools and servers

Each logged row names the table/figure row it belongs to (``row``), a training step, and numeric metrics. W&B mode
follows ``WANDB_MODE`` (``offline`` unless set; ``online`` when the user configured W&B; ``disabled``: only the
sidecar); a W&B that fails to start is reported and the run goes on without it. Project, group and tags name the
artifact, profile, machine and git sha so runs can be found on a W&B server too.

    with MetricsLogger("results/x/run0", artifact="fig5", profile="cpu-tiny", config=cfg) as log:
        log.log({"latency_s": 0.12, "peak_mem_gb": 1.5}, row="zigzag cp=2")

``resume_at=k`` continues a killed run in the same folder from step k: the rows it logged before step k are kept
(a row cut off by the kill is dropped), later ones are dropped because the run logs them again, so every step is
in the sidecar exactly once. ``measured_on`` (a hardware record as the measured runs detected it) labels values
derived elsewhere from those runs, e.g. a summary recomputed on a laptop from GPU runs; the computing machine is
kept as ``derived_on``.
"""
from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import math
import os
import shutil
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from repro.core.io import write_atomic, write_json_atomic
from repro.core.provenance import provenance
from repro.core.wandb_reader import WandbLogError, read_wandb_log

DEFAULT_PROJECT = "rl-spec-repro"
RESERVED_KEYS = ("row", "step")
SIDECAR, ENV = "metrics.jsonl", "env.json"


def wandb_mode() -> str:
    mode = os.environ.get("WANDB_MODE", "offline").strip().lower()
    aliases = {"dryrun": "offline", "run": "online", "disable": "disabled"}
    mode = aliases.get(mode, mode)
    if mode not in ("offline", "online", "disabled"):
        raise ValueError(f"WANDB_MODE={mode!r} is not one of offline, online, disabled")
    if mode != "disabled" and importlib.util.find_spec("wandb") is None:
        warnings.warn("wandb is not installed: logging to metrics.jsonl only (W&B disabled)")
        return "disabled"
    return mode


def read_sidecar(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl. A last line without its newline (a write cut off by a kill) is left out; any
    other unreadable line raises ValueError naming it."""
    path = Path(path)
    text = path.read_text()
    lines = text.split("\n")
    complete, tail = lines[:-1], lines[-1]
    rows = []
    for n, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not a JSON object ({exc.msg})") from exc
    if tail.strip():
        try:                                    # a complete last row that only lacks its newline
            rows.append(json.loads(tail))
        except json.JSONDecodeError:
            pass                                # cut off mid-write: not a logged row
    return rows


def _await_complete(log_path: Path, timeout_s: float = 30.0) -> None:
    """W&B's service closes its transaction log a moment after ``finish()`` returns; wait for the
    exit record so that whoever reads the log next (collect, a test) reads it whole."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if read_wandb_log(log_path).finished:
                return
        except (OSError, WandbLogError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{log_path} has no exit record {timeout_s:.0f} s after finish()")
        time.sleep(0.05)


class MetricsLogger:
    """Logs rows of metrics to ``metrics.jsonl`` and to W&B; use as a context manager."""

    def __init__(self, run_dir: str | os.PathLike, *, artifact: str, profile: str,
                 config: Mapping[str, Any] | None = None, name: str | None = None,
                 project: str | None = None, extra_tags: list[str] | None = None, resume_at: int | None = None,
                 measured_on: Mapping[str, Any] | None = None):
        self.run_dir = Path(run_dir)
        self.artifact, self.profile = artifact, profile
        self.config = dict(config or {})
        self.name = name or self.run_dir.name
        self.project = project or os.environ.get("REPRO_WANDB_PROJECT", DEFAULT_PROJECT)
        self.mode = wandb_mode()
        self.provenance = provenance(self.config)
        if measured_on is not None:      # values derived from runs on other hardware (a summary): theirs, as detected
            self.provenance["derived_on"] = self.provenance["hardware"]
            self.provenance["hardware"] = dict(measured_on)
        hw = self.provenance["hardware"]["tag"]
        sha = self.provenance["git"]["sha"][:10]
        self.tags = [f"artifact:{artifact}", f"profile:{profile}", f"hw:{hw}", f"git:{sha}", *(extra_tags or [])]
        self.resume_at = resume_at
        self._step = 0
        self._rows = 0
        self._sidecar = None
        self._wandb_run = None
        self._env: dict[str, Any] = {}

    # -- lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> MetricsLogger:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env_path, sidecar = self.run_dir / ENV, self.run_dir / SIDECAR
        old = json.loads(env_path.read_text()) if env_path.is_file() and self.resume_at is not None else {}
        resumes = list(old.get("resumes", []))
        if self.resume_at is not None and sidecar.is_file():
            kept = [r for r in read_sidecar(sidecar) if int(r.get("step", 0)) < self.resume_at]
            write_atomic(sidecar, "".join(json.dumps(r) + "\n" for r in kept))
            resumes.append({"at_step": self.resume_at, "kept_rows": len(kept),
                            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})
            self._step, self._rows = self.resume_at, len(kept)
        else:
            # A fresh start replaces the previous run wholesale, so a rerun never mixes two runs.
            shutil.rmtree(self.run_dir / "wandb", ignore_errors=True)
            write_atomic(sidecar, "")
        self._env = {"artifact": self.artifact, "profile": self.profile, "run": self.name, "finished": False,
                     "resumes": resumes, "wandb_mode": self.mode, "wandb_run_id": old.get("wandb_run_id"),
                     "tags": self.tags, **self.provenance}
        write_json_atomic(env_path, self._env)
        self._sidecar = open(sidecar, "a")
        if self.mode != "disabled":
            self._wandb_run = self._start_wandb(old.get("wandb_run_id"))
            if self._wandb_run is not None:
                self._env["wandb_run_id"] = self._wandb_run.id
                write_json_atomic(env_path, self._env)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(exit_code=0 if exc_type is None else 1)

    def _start_wandb(self, run_id: str | None):
        """The W&B mirror, or None (with a warning) when W&B cannot start: the sidecar is the record."""
        try:
            import wandb
            os.environ.setdefault("WANDB_SILENT", "true")
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
            (self.run_dir / "wandb").mkdir(parents=True, exist_ok=True)
            return wandb.init(
                project=self.project, group=self.artifact, job_type=self.artifact, name=self.name,
                tags=self.tags, dir=str(self.run_dir), mode=self.mode, reinit="create_new",
                id=run_id, resume="allow" if run_id else None,
                config={"artifact": self.artifact, "profile": self.profile,
                        "hardware": self.provenance["hardware"]["tag"],
                        "git_sha": self.provenance["git"]["sha"], "run_config": self.config},
                settings=wandb.Settings(console="off", x_disable_stats=True, x_disable_meta=True, save_code=False),
            )
        except Exception as exc:       # noqa: BLE001 - any W&B failure: keep measuring into the sidecar
            print(f"metrics: W&B did not start ({type(exc).__name__}: {exc}); logging to {SIDECAR} only",
                  file=sys.stderr, flush=True)
            return None

    def close(self, exit_code: int = 0) -> None:
        if self._sidecar is not None:
            self._sidecar.close()
            self._sidecar = None
            if exit_code == 0:
                self._env.update(finished=True, rows=self._rows)
                write_json_atomic(self.run_dir / ENV, self._env)
        if self._wandb_run is not None:
            try:
                log_path = Path(self._wandb_run.settings.sync_file)
                self._wandb_run.finish(exit_code=exit_code)
                _await_complete(log_path)
            except Exception as exc:   # noqa: BLE001 - the mirror's failure is not the run's
                print(f"metrics: W&B did not finish cleanly ({exc})", file=sys.stderr, flush=True)
            self._wandb_run = None

    # -- logging -----------------------------------------------------------------------------------
    def log(self, metrics: Mapping[str, float], *, row: str = "", step: int | None = None) -> None:
        """Log numeric ``metrics`` for table/figure ``row`` at training ``step`` (default: a counter)."""
        if self._sidecar is None:
            raise RuntimeError("MetricsLogger.log called outside its `with` block")
        clean: dict[str, float] = {}
        for key, value in metrics.items():
            if key in RESERVED_KEYS or key.startswith("_"):
                raise ValueError(f"metric name {key!r} is reserved (reserved: {RESERVED_KEYS}, '_*')")
            value = float(value)
            if math.isnan(value):
                raise ValueError(f"metric {key!r} of row {row!r} is NaN")
            clean[key] = value
        step = self._step if step is None else int(step)
        self._step = step + 1
        record = {"row": row, "step": step, **clean}
        self._sidecar.write(json.dumps(record) + "\n")
        self._sidecar.flush()
        self._rows += 1
        if self._wandb_run is not None:
            self._wandb_run.log(record)
