"""Progress of long work on the terminal: steps done of total, elapsed time and ETA.

One line per update (rate-limited), in tqdm's own words, so several jobs of a workflow can share a terminal and a
log file (Snakemake tees each job's output into its log); a bar redrawn in place only when stderr is a terminal.

    bar = Progress(60, "table1 Qwen3-8B/DFlash")
    for step in range(60):
        ...
        bar.update(info=f"reward {r:.3f}")   # "table1 Qwen3-8B/DFlash:  17%|#6  | 10/60 [00:32<02:41, ...] reward ..."
"""
from __future__ import annotations

import sys
import time

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, label: str, *, done: int = 0, every_s: float = 5.0, unit: str = "step"):
        self.total, self.label, self.n, self.unit = int(total), label, int(done), unit
        self.every_s = every_s
        self.start = time.monotonic()
        self._first = done          # steps already done when this process started (a resumed run)
        self._last_print = -float("inf")
        self._tty = sys.stderr.isatty()

    def line(self, info: str = "") -> str:
        elapsed = time.monotonic() - self.start
        # the rate (and so the ETA) counts only this process's steps
        rate = (self.n - self._first) / elapsed if elapsed > 0 and self.n > self._first else None
        meter = tqdm.format_meter(self.n, self.total, elapsed, prefix=self.label, ascii=True, ncols=80,
                                  unit=self.unit, rate=rate, initial=self._first)
        return meter + (f" {info}" if info else "")

    def update(self, n: int = 1, info: str = "") -> None:
        self.n = min(self.total, self.n + n)
        now = time.monotonic()
        if now - self._last_print >= self.every_s or self.n >= self.total:
            self._last_print = now
            end = "\r" if self._tty and self.n < self.total else "\n"
            print(self.line(info), file=sys.stderr, end=end, flush=True)
