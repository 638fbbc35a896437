"""time_samples: warm-up calls, then the timed repeats with Python's cyclic garbage collector paused (and restored
as it was)."""
from __future__ import annotations

import gc

import pytest

from repro.core.timing import gc_paused, time_samples


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
