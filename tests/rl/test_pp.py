"""The joint update under pipeline parallelism (PP=2, gloo, TapChannel over shared memory) equals the
single-process update: same policy and draft parameters after one GRPO + EAGLE-3 step, with the
draft's taps from the first stage shipped to the last stage outside the schedule.

    .venv/bin/python -m pytest -q tests/rl/test_pp.py
"""
import pytest
import torch

from kernels.launch import spawn
from repro.rl.grpo import group_advantages
from repro.rl.pp import make_payload, pp_update_worker
from repro.rl.trainer import CoTrainer
from tests.rl.conftest import tiny_config

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("draft", ["eagle3", None])
def test_pp2_update_equals_single_process(tmp_path, tok, draft):
    cfg = tiny_config(tmp_path, draft=draft)
    tr = CoTrainer(cfg, tok)
    batch = tr.rollout(0)
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = group_advantages(batch.rewards, 2)
    payload = make_payload(cfg, tr.policy, tr.draft, batch, adv, n_microbatches=2, mask_token_id=tok.mask_id)
    before = {k: v.clone() for k, v in tr.policy.model.state_dict().items()}
    tr.update.step(batch, adv)                       # microbatch 2 = B / n_microbatches
    ref = tr.policy.model.state_dict()
    ranks = spawn(pp_update_worker, 2, args=(payload,), timeout_s=180)
    got = {**ranks[0]["policy"], **ranks[1]["policy"]}
    assert set(got) == {n for n, _ in tr.policy.model.named_parameters()}, "stages lost or invented parameters"
    moved = 0
    for k, v in got.items():
        torch.testing.assert_close(v, ref[k], rtol=1e-4, atol=1e-6, msg=f"policy parameter {k}")
        moved += int(not torch.equal(before[k], ref[k]))
    assert moved > 0, "the update changed no parameter"
    if draft:
        for k, v in tr.draft.state_dict().items():
            torch.testing.assert_close(ranks[1]["draft"][k], v, rtol=1e-4, atol=1e-6, msg=f"draft {k}")
        assert ranks[1]["tap_wait_s"] >= 0
        assert ranks[1]["stats"]["draft_loss"] > 0
