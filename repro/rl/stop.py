"""Stop a training loop at a step boundary on SIGINT or SIGTERM, so that the steps already run are kept.

A co-training job killed mid-run resumes from its last periodic checkpoint and runs again every step after it (up
to ``ckpt_every`` - 1 steps, or the whole run where a profile writes none). Under ``StopOnSignal`` the first SIGINT
or SIGTERM (Ctrl-C, ``timeout``, a scheduler's preemption notice, Snakemake stopping its jobs) only sets
``requested``: the loop finishes the step in flight, checkpoints each row after its last finished step
(``CoTrainer.save_after_stop``) and returns ``exit_code`` (128 + the signal's number), and the same command run again
continues from there. A second signal stops at once (KeyboardInterrupt), as an untrapped one would; with
``same_within_s``, one that comes that soon after the first counts as the same request (under torchrun a worker
gets a Ctrl-C or a group-wide kill twice: from the terminal or the killer, and forwarded by the launcher). Handlers
are installed only in the main thread and only for the ``with`` block: a build or warm-up outside it stops at once.

    with StopOnSignal("lockstep") as stop:
        for step in ...:
            trainer.run_step(step, log)
            if stop.requested:
                break
    if stop.requested:
        trainer.save_after_stop()
        return stop.exit_code
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal:
    def __init__(self, who: str, same_within_s: float = 0.0):
        self.who, self.same_within_s = who, same_within_s
        self.signum: int | None = None
        self._first_at = 0.0
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 0)

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            if time.monotonic() - self._first_at < self.same_within_s:     # the first one, delivered again
                return
            self.__exit__()               # a second signal: stop now, as without this handler
            raise KeyboardInterrupt
        self.signum, self._first_at = signum, time.monotonic()
        # straight to fd 2: the handler may interrupt a write to sys.stderr (the progress bar's), and writing
        # through the same buffered stream from inside it would raise a reentrant-call RuntimeError there
        message = (f"{self.who}: {signal.Signals(signum).name}: stopping after the step in flight, with every row "
                   "checkpointed after its last finished step; the same command continues from there (a second "
                   "signal stops at once)\n")
        try:
            os.write(2, message.encode())
        except OSError:
            pass


def say(message: str) -> None:
    """Print to stderr, never raising: the reader of a pipe may already be gone when a job is being stopped."""
    try:
        print(message, file=sys.stderr, flush=True)
    except OSError:
        pass
