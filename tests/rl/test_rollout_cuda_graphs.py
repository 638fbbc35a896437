"""The co-trainer with ``cuda_graphs: draft`` (rl.rollout): on CPU its rollouts equal the default's.

    .venv/bin/python -m pytest -q tests/rl/test_rollout_cuda_graphs.py
"""
import pytest
import torch

from repro.rl.trainer import CoTrainer
from tests.rl.conftest import tiny_config


@pytest.mark.timeout(120)
@pytest.mark.parametrize("draft", ["eagle3", "dspark"])
def test_cotrainer_rollout_with_draft_graphs_equals_default(tmp_path, tok, draft):
    batches = {}
    for mode in ("off", "draft"):
        tr = CoTrainer(tiny_config(tmp_path / mode, draft=draft, cuda_graphs=mode), tok)
        assert tr.engine.cuda_graphs == mode
        batches[mode] = tr.rollout(0)
    off, on = batches["off"], batches["draft"]
    assert torch.equal(off.input_ids, on.input_ids) and torch.equal(off.loss_mask, on.loss_mask)
    torch.testing.assert_close(off.rollout_logp, on.rollout_logp, rtol=0, atol=1e-6)
    assert off.policy_forwards == on.policy_forwards and off.gen_tokens == on.gen_tokens


@pytest.mark.timeout(180)
@pytest.mark.parametrize("draft", [None, "eagle3", "dspark"])
def test_cotrainer_all_static_logprobs_equal_the_trainers(tmp_path, tok, draft):
    """``cuda_graphs: all`` (eager on CPU): the engine's log-probabilities of the sampled tokens equal the
    trainer policy's recomputation (teacher-forced, fp32) to 1e-5, and the rollout is well formed."""
    tr = CoTrainer(tiny_config(tmp_path, draft=draft, cuda_graphs="all"), tok)
    assert tr.engine.cuda_graphs == "all"
    batch = tr.rollout(0)
    assert batch.gen_tokens == int(batch.loss_mask.sum()) > 0
    with torch.no_grad():
        logits = tr.policy.forward_train(batch.input_ids, want_taps=False,
                                         attention_mask=batch.attention_mask).logits.float()
    temp = tr.cfg.grpo.temperature
    lp = torch.log_softmax(logits[:, :-1] / temp, -1).gather(2, batch.input_ids[:, 1:, None])[:, :, 0]
    m = batch.loss_mask[:, 1:] > 0
    torch.testing.assert_close(batch.rollout_logp[:, 1:][m], lp[m], rtol=0, atol=1e-5)
    if draft is not None:
        assert batch.counters.verify_steps > 0


@pytest.mark.timeout(240)
@pytest.mark.parametrize("draft", ["eagle3", "dspark"])
def test_cotrainer_compiled_drafts_follow_the_online_draft(tmp_path, tok, draft, monkeypatch):
    """``cuda_graphs: compiled_drafts`` (the drafts' static calls compiled whole; dynamo with its eager backend here,
    to keep CI short): after a training step has updated the draft and pushed it to the rollout copy, the next
    rollout equals the one of ``all`` (the same calls uncompiled), so the compiled calls read the pushed weights."""
    from repro.rollout.engine import RolloutEngine
    monkeypatch.setitem(RolloutEngine.__init__.__kwdefaults__, "compile_backend", "eager")
    batches = {}
    for mode in ("all", "compiled_drafts"):
        tr = CoTrainer(tiny_config(tmp_path / mode, draft=draft, cuda_graphs=mode), tok)
        assert tr.engine.cuda_graphs == mode
        assert tr.engine.proposer.compile_static == ("eager" if mode == "compiled_drafts" else None)
        tr.train_step(0)
        batches[mode] = tr.rollout(1)
        tr.close()
    ref, got = batches["all"], batches["compiled_drafts"]
    assert torch.equal(ref.input_ids, got.input_ids) and torch.equal(ref.loss_mask, got.loss_mask)
    torch.testing.assert_close(ref.rollout_logp, got.rollout_logp, rtol=0, atol=1e-6)
    assert ref.counters.accepted == got.counters.accepted and ref.counters.verify_steps > 0
