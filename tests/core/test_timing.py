"""time_samples: warm-up calls, then the timed repeats with Python's cyclic garbage collector paused (and restored
as it was); StreamSpan on a CPU: the host clock from construction to stop."""
from __future__ import annotations

import gc
import time

import pytest
import torch

from repro.core.timing import StreamSpan, gc_paused, time_samples


def test_timed_repeats_run_with_the_collector_paused_and_it_is_restored():
    seen = []
    assert gc.isenabled()
    samples = time_samples(lambda: seen.append(gc.isenabled()), warmup=2, repeats=3)
    assert len(samples) == 3 and all(s >= 0 for s in samples)
    assert seen == [True, True, False, False, False]      # warm-up as the program runs; samples without collections
    assert gc.isenabled()


def test_gc_paused_leaves_a_disabled_collector_disabled_and_restores_after_errors():
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(ZeroDivisionError), gc_paused():
        1 / 0
    assert gc.isenabled()


def test_a_cpu_stream_span_covers_the_work_between_start_and_stop():
    span = StreamSpan(torch.device("cpu"))
    time.sleep(0.02)
    span.stop()
    time.sleep(0.2)                       # after stop: not counted
    assert 0.02 <= span.seconds() < 0.2
    assert not StreamSpan(None).cuda
