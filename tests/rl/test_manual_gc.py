"""rl.manual_gc_interval (Megatron-LM's --manual-gc): Python's automatic collector off while training, one timed
full collection after every N-th step, the collector back on after the run.

    .venv/bin/python -m pytest -q tests/rl/test_manual_gc.py
"""
import gc

import pytest

from repro.rl.config import ConfigError
from repro.rl.trainer import CoTrainer
from tests.rl.conftest import tiny_config


@pytest.mark.timeout(120)
def test_manual_gc_collects_every_n_steps_inside_the_step(tmp_path, tok):
    """``manual_gc_interval``: automatic GC off while training, a timed full collection after every N-th step,
    GC back on after the run; a bad value is refused."""
    class Logged(list):
        def log(self, m, *, row="", step=None):
            self.append((step, gc.isenabled()))

    cfg = tiny_config(tmp_path / "gc", steps=3, manual_gc_interval=2)
    tr = CoTrainer(cfg.validate(), tok)
    assert gc.isenabled()
    logged = Logged()
    rows = tr.run(logged)
    assert logged == [(0, False), (1, False), (2, False)]
    assert gc.isenabled()
    assert [r["train/gc_s"] > 0 for r in rows] == [False, True, False]
    assert all(r["train/gc_s"] < r["train/step_time_s"] for r in rows)
    with pytest.raises(ConfigError, match="manual_gc_interval"):
        tiny_config(tmp_path / "bad", manual_gc_interval=-1).validate()
