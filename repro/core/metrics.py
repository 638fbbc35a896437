"""The one metrics logger of every experiment: W&B (offline by default) plus a metrics.jsonl sidecar.

A run lives in its own folder ``results/<hw>/<profile>/<artifact>/<run>/``:
    env.json         provenance (hardware, versions, git, date) and the run's config
    metrics.jsonl    one JSON object per logged row (the sidecar; read only when W&B is disabled)
    wandb/           W&B's own files (offline-run-*/run-*.wandb), read back by ``repro.report.collect``

Each logged row names the table/figure row it belongs to (``row``), an optional training step,
and numeric metrics. W&B mode follows ``WANDB_MODE`` (``offline`` unless set; ``online`` when the
user configured W&B; ``disabled`` writes only the sidecar). Project, group and tags name the
artifact, profile, hardware and git sha so the collector can find runs online too.

    with MetricsLogger("results/x/run0", artifact="fig5", profile="cpu-tiny", config=cfg) as log:
        log.log({"latency_s": 0.12, "peak_mem_gb": 1.5}, row="zigzag cp=2")

``resume=True`` continues a crashed run in the same folder: earlier rows are kept, W&B continues the
same run id in a new log file, and collect lets later rows win on (row, step). ``measured_on`` (a hardware
record as the measured runs detected it) labels values derived elsewhere from those runs, e.g. a summary
recomputed on a laptop from GPU runs; the computing machine is kept as ``derived_on``.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Mapping

from repro.core.io import write_json_atomic
from repro.core.provenance import provenance

DEFAULT_PROJECT = "rl-spec-repro"
RESERVED_KEYS = ("row", "step")


def wandb_mode() -> str:
    mode = os.environ.get("WANDB_MODE", "offline").strip().lower()
    aliases = {"dryrun": "offline", "run": "online", "disable": "disabled"}
    mode = aliases.get(mode, mode)
    if mode not in ("offline", "online", "disabled"):
        raise ValueError(f"WANDB_MODE={mode!r} is not one of offline, online, disabled")
    if mode != "disabled" and importlib.util.find_spec("wandb") is None:
        # e.g. a lent GPU machine without the package: keep the sidecar, which collect then reads.
        warnings.warn("wandb is not installed: logging to metrics.jsonl only (W&B disabled)")
        return "disabled"
    return mode


class MetricsLogger:
    """Logs rows of metrics to W&B and to ``metrics.jsonl``; use as a context manager."""

    def __init__(self, run_dir: str | os.PathLike, *, artifact: str, profile: str,
                 config: Mapping[str, Any] | None = None, name: str | None = None,
                 project: str | None = None, extra_tags: list[str] | None = None, resume: bool = False,
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
        self.tags = [f"artifact:{artifact}", f"profile:{profile}", f"hw:{hw}", f"git:{sha}",
                     *(extra_tags or [])]
        self._step = 0
        self._sidecar = None
        self._wandb_run = None
        self.resume = resume
        self._wandb_id = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> "MetricsLogger":
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env_path, sidecar = self.run_dir / "env.json", self.run_dir / "metrics.jsonl"
        if self.resume and env_path.is_file():
            # Resuming a crashed run: keep its rows (W&B continues the same run id in a new log file;
            # collect reads every log of the folder, later rows winning on (row, step)).
            self._wandb_id = json.loads(env_path.read_text()).get("wandb_run_id")
            mode = "a"
        else:
            # A fresh start replaces the previous run wholesale, so a rerun never mixes two runs.
            import shutil
            shutil.rmtree(self.run_dir / "wandb", ignore_errors=True)
            mode = "w"
        # The sidecar is appended row by row: a crash keeps every logged row.
        self._sidecar = open(sidecar, mode)
        if self.mode != "disabled":
            self._wandb_run = self._start_wandb()
            self._wandb_id = self._wandb_run.id
        write_json_atomic(env_path, {
            "artifact": self.artifact, "profile": self.profile, "run": self.name,
            "wandb_mode": self.mode, "wandb_run_id": self._wandb_id, "tags": self.tags, **self.provenance})
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(exit_code=0 if exc_type is None else 1)

    def _start_wandb(self):
        import wandb
        os.environ.setdefault("WANDB_SILENT", "true")
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        wandb_dir = self.run_dir / "wandb"
        wandb_dir.mkdir(parents=True, exist_ok=True)
        return wandb.init(
            project=self.project, group=self.artifact, job_type=self.artifact, name=self.name,
            tags=self.tags, dir=str(self.run_dir), mode=self.mode, reinit="create_new",
            id=self._wandb_id, resume="allow" if self._wandb_id else None,
            config={"artifact": self.artifact, "profile": self.profile,
                    "hardware": self.provenance["hardware"]["tag"],
                    "git_sha": self.provenance["git"]["sha"], "run_config": self.config},
            settings=wandb.Settings(console="off", x_disable_stats=True, x_disable_meta=True,
                                    save_code=False),
        )

    def close(self, exit_code: int = 0) -> None:
        if self._sidecar is not None:
            self._sidecar.close()
            self._sidecar = None
        if self._wandb_run is not None:
            self._wandb_run.finish(exit_code=exit_code)
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
        if self._wandb_run is not None:
            self._wandb_run.log(record)

    def log_many(self, rows: list[tuple[str, Mapping[str, float]]]) -> None:
        for row, metrics in rows:
            self.log(metrics, row=row)
