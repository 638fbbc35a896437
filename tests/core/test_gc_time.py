"""repro.core.gc_time: the collector's running time and the freeze."""
import gc

from repro.core.gc_time import collector_seconds, freeze_survivors


def test_collector_seconds_counts_collections_and_only_them():
    start = collector_seconds()
    junk = [[i] for i in range(300_000)]
    gc.collect()
    after_collect = collector_seconds()
    assert after_collect > start
    del junk
    gc.disable()
    try:
        sum(range(1_000_000))                              # work without a collection adds nothing
        assert collector_seconds() == after_collect
    finally:
        gc.enable()


def test_freeze_survivors_takes_live_objects_out_of_collections():
    gc.unfreeze()
    try:
        kept = [[i] for i in range(100_000)]
        frozen = freeze_survivors()
        assert frozen == gc.get_freeze_count() >= len(kept)
        assert not any(o is kept for o in gc.get_objects(generation=2))     # out of every generation's walks
        gc.unfreeze()
        assert any(o is kept for o in gc.get_objects(generation=2))
    finally:
        gc.unfreeze()
