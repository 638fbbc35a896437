"""The ``rollout_backend`` option: validated in the config, and the co-trainer decoding through vLLM.

The config tests run everywhere; the trainer test needs vLLM (``bash scripts/setup.sh --vllm``):

    .venv-vllm/bin/python -m pytest -q tests/rl/test_vllm_rollout_backend.py
"""
from __future__ import annotations

import pytest
import torch

from repro.rl.config import ConfigError, RunConfig
from repro.rl.drafts import make_proposer
from repro.rollout.engine import RolloutEngine
from repro.rollout.vllm_backend import vllm_version

from .conftest import tiny_config

needs_vllm = pytest.mark.skipif(vllm_version() is None, reason="vLLM is not importable in this venv (bash "
                                "scripts/setup.sh --vllm; run with .venv-vllm/bin/python)")


def test_rollout_backend_config(tmp_path):
    cfg = tiny_config(tmp_path, draft="eagle3")
    assert cfg.rollout_backend == "suite"
    assert "rollout_backend" not in cfg.to_dict()               # default configs are unchanged
    cfg.rollout_backend = "vllm"
    d = cfg.validate().to_dict()
    assert d["rollout_backend"] == "vllm" and RunConfig.from_dict(d).rollout_backend == "vllm"
    cfg.rollout_backend = "sglang"
    with pytest.raises(ConfigError, match=r"rollout_backend='sglang'.*one of \('suite', 'vllm'\)"):
        cfg.validate()
    with pytest.raises(ConfigError, match="EAGLE-3 drafts only"):
        tiny_config(tmp_path, draft="dflash", rollout_backend="vllm").validate()


@needs_vllm
@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_cotrainer_with_vllm_rollouts(tmp_path, tok):
    from repro.rl.trainer import CoTrainer
    cfg = tiny_config(tmp_path / "v", draft="eagle3", rollout_backend="vllm")
    cfg.policy.overrides["head_dim"] = 32                       # vLLM's CPU attention: head_dim >= 32
    tr = CoTrainer(cfg, tok)
    try:
        prompts = [[tok.user_id] + tok.encode(t) + [tok.assistant_id] for t in ("What is 2+3?", "Add 7 and 9.")]

        def same_as_suite():
            k = cfg.draft.num_proposals
            ours = RolloutEngine(tr.rollout_policy, make_proposer(tr.rollout_draft, k)).generate(
                prompts, max_new_tokens=12, greedy=True)
            v = tr.engine.generate(prompts, max_new_tokens=12, greedy=True)
            assert v.tokens == ours.tokens
            assert v.counters.as_dict() == ours.counters.as_dict()

        same_as_suite()
        before = [p.detach().clone() for p in tr.rollout_draft.parameters()]
        m, batch, _ = tr.train_step(0)                         # rollout by vLLM, update, push (reload)
        assert batch.counters.verify_steps > 0 and m["train/acceptance_length"] >= 1.0
        assert torch.isfinite(batch.rollout_logp).all()
        # the draft always learns (a random policy's zero-advantage groups may leave the policy unchanged)
        assert any(not torch.equal(a, b) for a, b in zip(before, tr.rollout_draft.parameters()))
        same_as_suite()                                         # vLLM now runs the updated policy and draft
    finally:
        tr.engine.close()
