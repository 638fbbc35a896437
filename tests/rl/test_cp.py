"""The joint update under context parallelism (CP=2, PP=1, gloo, zigzag ring attention from kernels.attention
swapped into the HF policy, the draft's own CP attention on the same shards) equals the single-process
update: the policy alone, and the policy with a DFlash draft.

    .venv/bin/python -m pytest -q tests/rl/test_cp.py
"""
import pytest
import torch

from kernels.launch import spawn
from repro.rl.grpo import group_advantages
from repro.rl.mesh_update import cp_update_worker
from repro.rl.pp import make_payload
from repro.rl.trainer import CoTrainer
from tests.rl.conftest import tiny_config

pytestmark = pytest.mark.timeout(240)


def both_worker(rank, world, payloads):
    return [cp_update_worker(rank, world, p) for p in payloads]


def _reference(tr, batch, adv):
    ref, dref = {}, {}
    step = tr.update.optimizer.step

    def capture(*a, **k):                           # the single-process clipped gradients, before AdamW
        ref.update({n: p.grad.clone() for n, p in tr.policy.model.named_parameters()})
        if tr.draft is not None:
            dref.update({n: p.grad.clone() for n, p in tr.draft.named_parameters() if p.grad is not None})
        return step(*a, **k)
    tr.update.optimizer.step = capture
    return tr.update.step(batch, adv), ref, dref


@pytest.fixture(scope="module")
def cp2(tmp_path_factory, tok):
    tmp = tmp_path_factory.mktemp("cp")
    trainers = [CoTrainer(tiny_config(tmp / "none"), tok),
                CoTrainer(tiny_config(tmp / "dflash", draft="dflash"), tok)]
    batch = trainers[0].rollout(0)
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = group_advantages(batch.rewards, 2)
    payloads = [make_payload(tr.cfg, tr.policy, tr.draft, batch, adv, n_microbatches=2,
                             mask_token_id=tok.mask_id) for tr in trainers]
    refs = [_reference(tr, batch, adv) for tr in trainers]
    ranks = spawn(both_worker, 2, args=(payloads,), timeout_s=200)
    return refs, ranks, batch


@pytest.mark.parametrize("case", [0, 1], ids=["policy", "dflash"])
def test_cp2_update_equals_single_process(cp2, case):
    refs, ranks, batch = cp2
    stats, ref, dref = refs[case]
    outs = [r[case] for r in ranks]
    assert outs[0]["policy_loss"] == pytest.approx(stats.policy_loss, rel=1e-5, abs=1e-7)
    assert sum(float(g.abs().sum()) for g in ref.values()) > 0, "the reference update had no gradient"
    scale = max(float(g.abs().max()) for g in ref.values())
    for r in outs:
        assert set(r["grads"]) == set(ref)
        for k, g in r["grads"].items():
            # Adam's first step is ~lr * sign(grad): compare gradients, where tolerances mean something
            torch.testing.assert_close(g, ref[k], rtol=1e-4, atol=1e-5 * scale,
                                       msg=f"rank {r['rank']}: grad {k}")
    assert sum(r["local_rows"] for r in outs) >= int(batch.attention_mask.sum()) // 2
    if case == 1:
        assert outs[0]["draft_loss"] == pytest.approx(stats.draft_loss, rel=1e-5) and stats.draft_loss > 0
        dscale = max(float(g.abs().max()) for g in dref.values())
        for r in outs:
            assert set(r["draft_grads"]) == set(dref)
            for k, g in r["draft_grads"].items():
                torch.testing.assert_close(g, dref[k], rtol=1e-4, atol=1e-5 * dscale, msg=f"draft grad {k}")
