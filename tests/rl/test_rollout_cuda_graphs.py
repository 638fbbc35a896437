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
