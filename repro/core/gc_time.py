"""Time Python's cyclic garbage collector spends in this process, and the freeze that keeps it short.

A collection of the oldest generation walks every live container object; a training process that holds compiled
graphs, CUDA graphs and models has millions, so one such collection landing inside a timed step stalls it for up to
a second or more, with no compilation to show for it. ``collector_seconds()`` is a running total over every
collection (``gc.callbacks``), so a step reports the collector's share of its clock as the difference of two
reads (``train/gc_s``). ``freeze_survivors()``, called once the process has built and warmed what it keeps for the
whole run, moves those objects out of the collector's reach (``gc.freeze``): later collections walk only what the
steps allocate. Objects frozen are still freed by reference counting; a cycle among them is collected only once
they are unfrozen (``CoTrainer.close``, and the process's exit).

    gc0 = collector_seconds(); step(); m["train/gc_s"] = collector_seconds() - gc0
"""
from __future__ import annotations

import atexit
import gc
import time

_state = {"total": 0.0, "started": None, "installed": False, "unfreeze_at_exit": False}


def _on_collection(phase: str, info: dict) -> None:
    if phase == "start":
        _state["started"] = time.perf_counter()
    elif _state["started"] is not None:
        _state["total"] += time.perf_counter() - _state["started"]
        _state["started"] = None


def collector_seconds() -> float:
    """Seconds the collector has run in this process since the first call (which starts the count)."""
    if not _state["installed"]:
        gc.callbacks.append(_on_collection)
        _state["installed"] = True
    return _state["total"]


def freeze_survivors() -> int:
    """Collect once, then freeze every object still alive; returns how many are frozen. The process unfreezes them
    when it exits, so that the interpreter's last collection still reaches them (extensions such as Triton's
    report the objects it never freed as leaks)."""
    if not _state["unfreeze_at_exit"]:
        atexit.register(gc.unfreeze)
        _state["unfreeze_at_exit"] = True
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
