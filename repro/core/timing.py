"""Shared timing, memory and output discipline for the suite's benchmark programs.

Timing: warm-up first, then repeated samples; CUDA events on GPUs, ``perf_counter`` on CPUs; Python's cyclic
garbage collector collects its young generations before the samples and is paused during them (as ``timeit``
pauses it: a full collection walks every live object, and a benchmark process holding compiled graphs of many
configurations pays for them in whichever sample a collection lands); a distributed run synchronises ranks before
each sample and reports the slowest rank. Results are summarised as median with a p20/p80 spread, and the raw
samples are always kept.

Output: ``BenchRun`` owns a run folder. Each measured point goes to ``bench.json`` (raw samples,
config, provenance; written atomically when the run ends) and, as summary metrics, through the
suite's ``MetricsLogger`` (W&B + metrics.jsonl) so ``collect`` sees it like any other experiment.
With ``resume=True`` every record is also appended to ``bench.partial.jsonl`` until the run ends, and a
run of the same artifact, profile, config, commit and machine that was cut off (killed, out of time) is
continued: ``restored(row)`` hands back a measured row of the earlier attempt (marked ``resumed``) so the
program skips it, and the finished ``bench.json`` holds every row once.

    with BenchRun(out_dir, artifact="fig5", profile="cpu-tiny", config=cfg) as bench:
        samples = time_samples(step, warmup=2, repeats=5)
        bench.record("zigzag cp=2", {"cp": 2}, samples, extra={"peak_mem_gb": 1.2})
        if bench.restored("usp cp=2") is None:      # with resume=True: measured by an earlier attempt?
            bench.record("usp cp=2", {"cp": 2}, time_samples(other, warmup=2, repeats=5))
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from repro.core.io import write_atomic, write_json_atomic
from repro.core.metrics import MetricsLogger
from repro.core.provenance import provenance


def summarize(samples: list[float]) -> dict[str, float]:
    """Median with p20/p80 spread (nearest-rank quantiles) of a non-empty list of samples."""
    if not samples:
        raise ValueError("summarize() needs at least one sample")
    s = sorted(samples)

    def q(p: float) -> float:
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]

    return {"median": statistics.median(s), "p20": q(0.2), "p80": q(0.8), "min": s[0], "max": s[-1],
            "n": len(s)}


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


class StreamSpan:
    """A stretch of work on a device, from construction to ``stop()``: CUDA events on a GPU (recorded on the current
    stream, so marking a span costs no host sync), the host clock elsewhere, where work runs as it is issued."""

    def __init__(self, device: torch.device | None):
        self.cuda = device is not None and device.type == "cuda"
        if self.cuda:
            self.begin, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.t0, self.t1 = time.perf_counter(), None

    def stop(self) -> None:
        if self.cuda:
            self.end.record()
        else:
            self.t1 = time.perf_counter()

    def seconds(self) -> float:
        """Seconds from start to ``stop``; on a GPU it first waits for the stream to pass ``stop``."""
        if not self.cuda:
            return self.t1 - self.t0
        self.end.synchronize()
        return self.begin.elapsed_time(self.end) / 1e3


def time_samples(fn: Callable[[], Any], *, warmup: int = 2, repeats: int = 5,
                 device: torch.device | str | None = None, group=None) -> list[float]:
    """Seconds per call of ``fn`` over ``repeats`` calls after ``warmup`` calls.

    With a process ``group``, ranks meet at a barrier before each call and every rank returns the
    slowest rank's time (a collective step is as slow as its slowest rank).
    """
    device = torch.device(device) if device is not None else None
    for _ in range(warmup):
        fn()
    _sync(device)
    with gc_paused():
        return _samples(fn, repeats, device, group)


@contextlib.contextmanager
def gc_paused():
    """Collect the young generations once, then keep the cyclic garbage collector off inside the block (restored
    after, as it was). The oldest generation is not collected: that walk visits every live object (in a process
    holding models and compiled graphs, most of a second, and a sweep enters this block for every point) and frees
    nothing that a timed call could trip over, since no collection runs inside the block."""
    was_enabled = gc.isenabled()
    gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _samples(fn: Callable[[], Any], repeats: int, device: torch.device | None, group) -> list[float]:
    import torch.distributed as dist
    samples = []
    for _ in range(repeats):
        if group is not None:
            dist.barrier(group=group)
        span = StreamSpan(device)
        fn()
        span.stop()
        seconds = span.seconds()
        if group is not None:
            t = torch.tensor([seconds], dtype=torch.float64,
                             device=device if device is not None and device.type == "cuda" else "cpu")
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            seconds = float(t.item())
        samples.append(seconds)
    return samples


class PeakMemory:
    """Peak memory of a region, in GB.

    CUDA: ``torch.cuda.max_memory_allocated`` after a reset (tensors only, as the paper reports).
    CPU: the process's resident-set high-water mark (``ru_maxrss``) minus the resident set at entry;
    meaningful in a fresh process per configuration, which is how the CPU benchmarks run.
    """

    def __init__(self, device: torch.device | str | None = None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.peak_gb = float("nan")

    @staticmethod
    def _rss_gb() -> float:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9
        except OSError:
            return 0.0

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = 0.0
        else:
            self._base = self._rss_gb()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_gb = torch.cuda.max_memory_allocated(self.device) / 1e9
        else:
            scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1e9
            self.peak_gb = max(0.0, peak - self._base)


JOURNAL = "bench.partial.jsonl"


class BenchRun:
    """A benchmark run folder: bench.json with raw samples + the suite's metrics logger (+ the journal, resuming)."""

    def __init__(self, out_dir: str | os.PathLike, *, artifact: str, profile: str,
                 config: Mapping[str, Any], log_metrics: bool = True, resume: bool = False):
        self.out_dir = Path(out_dir)
        self.artifact, self.profile, self.config = artifact, profile, dict(config)
        self.records: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {}      # run-level results written beside the records (e.g. ceilings)
        self._start = time.monotonic()
        self._logger = (MetricsLogger(self.out_dir, artifact=artifact, profile=profile, config=config)
                        if log_metrics else None)
        self.resume = resume
        self._journal = None
        self._earlier: dict[str, dict[str, Any]] = {}
        if resume:
            prov = self._logger.provenance if self._logger is not None else provenance(self.config)
            # what must match for an earlier attempt's rows to count as this run's
            self._identity = json.loads(json.dumps({
                "artifact": artifact, "profile": profile, "config": self.config, "git": prov["git"].get("sha"),
                "dirty": prov["git"].get("dirty"), "hardware": prov["hardware"].get("tag")}, default=str))
            self._earlier = self._read_journal()

    def _read_journal(self) -> dict[str, dict[str, Any]]:
        """The measured rows (raw samples kept) of an earlier attempt of this very run, by row label."""
        path = self.out_dir / JOURNAL
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return {}
        rows: dict[str, dict[str, Any]] = {}
        for i, line in enumerate(lines):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:         # a line cut off by a kill
                break
            if i == 0 and obj != {"identity": self._identity}:
                return {}
            if i > 0 and obj.get("samples_s"):
                rows[obj["row"]] = obj
        return rows

    @property
    def identity(self) -> dict[str, Any] | None:
        """What an earlier attempt must match for its rows to count as this run's (None without ``resume``)."""
        return self._identity if self.resume else None

    def carried(self, rec: Mapping[str, Any]) -> dict[str, Any]:
        """A record an earlier attempt of this run kept elsewhere (a state file of its own), now one of this run's."""
        rec = {**rec, "resumed": True}
        self._add(rec)
        return rec

    def restored(self, row: str) -> dict[str, Any] | None:
        """An earlier attempt's measured ``row`` (with ``resume=True``), now one of this run's records; else None."""
        rec = self._earlier.pop(row, None)
        if rec is None:
            return None
        rec = {**rec, "resumed": True}
        self._add(rec)
        return rec

    def __enter__(self) -> "BenchRun":
        if self._logger is not None:
            self._logger.__enter__()
        if self.resume:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            kept = [{"identity": self._identity}, *self._earlier.values()]
            path = self.out_dir / JOURNAL
            write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
            self._journal = open(path, "a")
        return self

    def record(self, row: str, params: Mapping[str, Any], samples_s: list[float] | None = None,
               extra: Mapping[str, float] | None = None) -> dict[str, Any]:
        """One measured point: its row label, parameters, raw time samples and other metrics."""
        rec: dict[str, Any] = {"row": row, "params": dict(params)}
        metrics: dict[str, float] = {}
        if samples_s:
            stats = summarize(samples_s)
            rec["samples_s"] = list(samples_s)
            rec["time_s"] = stats
            metrics.update({"time_s": stats["median"], "time_s_p20": stats["p20"],
                            "time_s_p80": stats["p80"]})
        for k, v in (extra or {}).items():
            metrics[k] = float(v)
        rec["metrics"] = metrics
        self._add(rec)
        if self._journal is not None:
            self._journal.write(json.dumps(rec) + "\n")
            self._journal.flush()
            os.fsync(self._journal.fileno())
        return rec

    def _add(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)
        metrics = rec["metrics"]
        if self._logger is not None and metrics:
            self._logger.log(metrics, row=rec["row"])
        elapsed = time.strftime("%H:%M:%S", time.gmtime(time.monotonic() - self._start))
        print(f"[{self.artifact} {elapsed}, record {len(self.records)}{', resumed' if rec.get('resumed') else ''}] "
              f"{rec['row']}: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()), flush=True)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self._journal is not None:
                self._journal.close()
            if exc_type is None:
                resumed = [r["row"] for r in self.records if r.get("resumed")]
                if resumed:
                    self.summary["resumed_rows"] = resumed
                write_json_atomic(self.out_dir / "bench.json", {
                    "artifact": self.artifact, "profile": self.profile, "config": self.config,
                    "provenance": provenance(self.config), "summary": self.summary, "records": self.records})
                if self.resume:
                    (self.out_dir / JOURNAL).unlink(missing_ok=True)
        finally:
            if self._logger is not None:
                self._logger.__exit__(exc_type, exc, tb)
