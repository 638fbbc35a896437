"""Process-level step metrics of the trainer: the garbage collector's time in each step (train/gc_s), the freeze of
what the warm-up leaves alive, rl.manual_gc_interval (Megatron-LM's --manual-gc: Python's automatic collector off
while training, one full collection after every N-th step, the collector back on after the run) and the running
CUDA-graph capture count.

    .venv/bin/python -m pytest -q tests/rl/test_trainer_process.py
"""
import gc

import pytest

from repro.core.specs import ConfigError
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
    # step 0 ran under automatic collection until its end; step 1 ends with the full collection; step 2 has none
    assert rows[1]["train/gc_s"] > 0 and rows[2]["train/gc_s"] == 0
    assert all(r["train/gc_s"] < r["train/step_time_s"] for r in rows)
    with pytest.raises(ConfigError, match="manual_gc_interval"):
        tiny_config(tmp_path / "bad", manual_gc_interval=-1).validate()


@pytest.mark.timeout(120)
def test_steps_report_the_collectors_time_and_the_warm_up_freezes_what_it_leaves(tmp_path, tok):
    """train/gc_s is the time collections took inside the step (a full collection forced inside the update shows in
    it); warm_up freezes the objects alive after it and close() unfreezes them."""
    from repro.rl import joint

    gc.unfreeze()
    tr = CoTrainer(tiny_config(tmp_path, steps=2).validate(), tok)
    tr.warm_up()
    assert gc.get_freeze_count() > 0
    step = joint.JointUpdate.step

    def collecting_step(self, *a, **kw):
        junk = [[i] for i in range(200_000)]           # containers for the collection to walk
        gc.collect()
        del junk
        return step(self, *a, **kw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(joint.JointUpdate, "step", collecting_step)
        forced = tr.train_step(0)[0]["train/gc_s"]
    plain = tr.train_step(1)[0]["train/gc_s"]
    assert forced > 0 and plain >= 0
    tr.close()
    assert gc.get_freeze_count() == 0


@pytest.mark.timeout(120)
def test_graph_capture_count_is_logged_with_graphs_on(tmp_path, tok):
    """With draft graphs configured the step logs the process's running capture count (on CPU the step runs
    eagerly and adds none to what earlier tests of this process emulated)."""
    import dataclasses

    from repro.decoding.cuda_graph import GraphedCallable
    cfg = tiny_config(tmp_path / "g", draft="dflash", steps=1)
    cfg.draft = dataclasses.replace(cfg.draft, microbatch=4, cuda_graph=True)
    before = GraphedCallable.total_captures
    m, _, _ = CoTrainer(cfg.validate(), tok).train_step(0)
    assert m["train/graph_captures"] == before
    m, _, _ = CoTrainer(tiny_config(tmp_path / "n", draft="dflash", steps=1), tok).train_step(0)
    assert "train/graph_captures" not in m


@pytest.mark.timeout(180)
def test_compiled_graphs_count_the_steps_compilations(tmp_path, tok, monkeypatch):
    """train/compiled_graphs: the graphs dynamo compiled during the step. The compiled update (dynamo's eager
    backend here) compiles in its first step and in no later one; an eager run logs 0."""
    import dataclasses

    import torch

    from repro.rl.joint import JointUpdate
    from repro.rollout import compiled_layers as cl
    monkeypatch.setattr(JointUpdate, "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(cl, "_COMPILED", {})
    torch._dynamo.reset()
    cfg = tiny_config(tmp_path / "c", steps=3)
    cfg.grpo = dataclasses.replace(cfg.grpo, compile_layers=True)
    tr = CoTrainer(cfg.validate(), tok)
    counts = [tr.train_step(step)[0]["train/compiled_graphs"] for step in range(3)]
    assert counts[0] > 0 and counts[1:] == [0, 0]
    m, _, _ = CoTrainer(tiny_config(tmp_path / "e", steps=1), tok).train_step(0)
    assert m["train/compiled_graphs"] == 0


@pytest.mark.timeout(60)
def test_close_finishes_its_cleanup_when_the_last_checkpoint_write_failed(tmp_path, tok, monkeypatch):
    """A failed background checkpoint write is raised by close(), after the tools' pool is stopped and garbage
    collection is back on."""
    import gc

    tr = CoTrainer(tiny_config(tmp_path, steps=1, manual_gc_interval=1).validate(), tok)
    tr._pool = __import__("concurrent.futures").futures.ThreadPoolExecutor(max_workers=1)
    gc.disable()

    def failed():
        raise RuntimeError("writing checkpoint x failed: disk full")
    monkeypatch.setattr(tr.checkpoints, "close", failed)
    with pytest.raises(RuntimeError, match="disk full"):
        tr.close()
    assert tr._pool is None and gc.isenabled()


@pytest.mark.timeout(120)
def test_warm_up_captures_the_graphed_draft_steps_longest_buckets(tmp_path, tok, monkeypatch):
    """With a graphed deferred draft step, warm_up runs it (weight 0) on the deferred pass's rows at the two longest
    sequence buckets a batch can fall in, leaving no gradient, no optimizer state and the weights as they were; the
    first step's draft call falls in one of those buckets (on a GPU: a replay, not a capture)."""
    import dataclasses

    import torch

    from repro.rl.draft_graph import DraftTrainStep

    cfg = tiny_config(tmp_path, draft="dflash", steps=1)
    cfg.draft = dataclasses.replace(cfg.draft, microbatch=4, cuda_graph=True)      # above the policy's 2: deferred
    tr = CoTrainer(cfg.validate(), tok)
    calls = []
    call = DraftTrainStep.__call__

    def spy(self, ids, *a, weight, **kw):
        calls.append((ids.shape[0], self.bucket_length(ids.shape[1]), weight))
        return call(self, ids, *a, weight=weight, **kw)
    monkeypatch.setattr(DraftTrainStep, "__call__", spy)
    weights = [p.detach().clone() for p in tr.update.policy_params + tr.update.draft_params]
    tr.warm_up()
    bucket = tr.update.draft_step.seq_bucket
    assert len(calls) == 2 and calls[1][1] == calls[0][1] + bucket
    assert all(rows == 4 and w == 0.0 for rows, _, w in calls)
    params = tr.update.policy_params + tr.update.draft_params
    assert all(p.grad is None for p in params) and not tr.update.optimizer.state
    assert all(torch.equal(p, w) for p, w in zip(params, weights))
    prepared = {b for _, b, _ in calls}
    calls.clear()
    tr.train_step(0)
    assert len(calls) == 1 and calls[0][1] in prepared
    tr.close()
