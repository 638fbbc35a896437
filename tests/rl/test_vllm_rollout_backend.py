"""The ``rollout_backend`` option: validated in the config, and the co-trainer decoding through vLLM.

The config tests run everywhere; the trainer test needs vLLM (``bash scripts/setup.sh --vllm``):

    .venv-vllm/bin/python -m pytest -q tests/rl/test_vllm_rollout_backend.py
"""
from __future__ import annotations

import pytest
import torch

from integrations.vllm.engine import vllm_version
from repro.core.specs import ConfigError
from repro.rl.config import RunConfig
from repro.rollout.engine import RolloutEngine

from .conftest import tiny_config

needs_vllm = pytest.mark.skipif(vllm_version() is None, reason="vLLM is not importable in this venv (bash "
                                "scripts/setup.sh --vllm; run with .venv-vllm/bin/python)")


def test_rollout_backend_config(tmp_path):
    cfg = tiny_config(tmp_path, draft="eagle3")
    assert cfg.rollout_backend == "suite"
    assert "rollout_backend" not in cfg.to_dict()               # default configs are unchanged
    cfg.device, cfg.rollout_backend = "cuda", "vllm"
    d = cfg.validate().to_dict()
    assert d["rollout_backend"] == "vllm" and RunConfig.from_dict(d).rollout_backend == "vllm"
    cfg.rollout_backend = "sglang"
    with pytest.raises(ConfigError, match=r"rollout_backend='sglang'.*one of \('suite', 'vllm'\)"):
        cfg.validate()
    with pytest.raises(ConfigError, match="EAGLE-3 and DFlash drafts only"):
        tiny_config(tmp_path, draft="dspark", rollout_backend="vllm").validate()
    with pytest.raises(ConfigError, match="speculative sampling is not lossless"):
        tiny_config(tmp_path, draft="eagle3", rollout_backend="vllm").validate()     # device cpu
    tiny_config(tmp_path, rollout_backend="vllm").validate()                           # no draft: fine


@needs_vllm
@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_cotrainer_with_vllm_rollouts(tmp_path, tok):
    """Rollouts sampled by vLLM (no draft on CPU: see above), and push() reaching the running engine."""
    from repro.rl.trainer import CoTrainer
    cfg = tiny_config(tmp_path / "v", rollout_backend="vllm")
    cfg.policy.overrides["head_dim"] = 32                       # vLLM's CPU attention: head_dim >= 32
    tr = CoTrainer(cfg, tok)
    try:
        prompts = [[tok.user_id] + tok.encode(t) + [tok.assistant_id] for t in ("What is 2+3?", "Add 7 and 9.")]

        def same_as_suite():
            ours = RolloutEngine(tr.rollout_policy).generate(prompts, max_new_tokens=12, greedy=True)
            v = tr.engine.generate(prompts, max_new_tokens=12, greedy=True)
            assert v.tokens == ours.tokens
            return v.tokens

        first = same_as_suite()
        m, batch, _ = tr.train_step(0)                         # rollout sampled by vLLM, update, push
        assert batch.counters.draft_tokens == 0 and batch.gen_tokens > 0 and m["train/rollout_time_s"] > 0
        lp = batch.rollout_logp[batch.loss_mask.bool()]
        assert lp.numel() == batch.gen_tokens and torch.isfinite(lp).all() and (lp <= 0).all()
        with torch.no_grad():                                   # a visible update, then the trainer's push
            for p in tr.policy.model.parameters():
                p.mul_(1.5)
        tr.push()
        assert same_as_suite() != first                         # vLLM now decodes the pushed weights
    finally:
        tr.engine.close()
