"""The joint update on a PP=2 x CP=2 mesh (4 gloo processes: 1F1B pipelines, zigzag ring attention in each
stage's CP group, taps over one TapChannel per CP index, the draft's CP attention on the last stage)
equals the single-process ``JointUpdate``: same clipped gradients, same updated policy and draft
parameters, same losses, for EAGLE-3 and DSpark (two draft layers, so one tap crosses stages; also two
steps under the draft's learning-rate warm-up, with the taps over the p2p transport instead of shared
memory); under bf16 autocast (the GPU path) it agrees with JointUpdate's autocast update to bf16 rounding;
and with lambda = 0 the policy update is bit for bit the no-draft one.

    .venv/bin/python -m pytest -q tests/rl/test_mesh_update.py
"""
import dataclasses

import pytest
import torch

from kernels.launch import spawn
from repro.core.specs import ConfigError, DraftSpec
from repro.rl.grpo import group_advantages
from repro.rl.mesh_update import MeshShape, mesh_update_worker
from repro.rl.pp import make_payload
from repro.rl.trainer import CoTrainer
from tests.rl.conftest import tiny_config

pytestmark = pytest.mark.timeout(300)
DSPARK2 = DraftSpec("dspark", num_proposals=3, options={"block_size": 3, "num_layers": 2, "num_anchors": 4})
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0])


def _trainer(tmp_path, tok, name, draft=None, spec=None, lam=None):
    cfg = tiny_config(tmp_path / name, draft=draft)
    if spec is not None:
        cfg.draft = spec
    if lam is not None:
        cfg.draft = dataclasses.replace(cfg.draft, loss_weight=lam)
    return CoTrainer(cfg, tok)


def _reference(tr, batch, adv, anchor_seed=3):
    """JointUpdate on the batch: clipped gradients just before AdamW, then the updated parameters."""
    grads, dgrads = {}, {}
    step = tr.update.optimizer.step

    def capture(*a, **k):
        grads.update({n: p.grad.clone() for n, p in tr.policy.model.named_parameters()})
        if tr.draft is not None:
            dgrads.update({n: p.grad.clone() for n, p in tr.draft.named_parameters() if p.grad is not None})
        return step(*a, **k)
    tr.update.optimizer.step = capture
    stats = tr.update.step(batch, adv, anchor_seed=anchor_seed)
    return {"stats": stats, "grads": grads, "draft_grads": dgrads,
            "policy": {n: p.detach().clone() for n, p in tr.policy.model.named_parameters()},
            "draft": ({n: p.detach().clone() for n, p in tr.draft.named_parameters()} if tr.draft is not None
                      else {})}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tok):
    tmp = tmp_path_factory.mktemp("mesh")
    trainers = {"eagle3": _trainer(tmp, tok, "e", draft="eagle3"),
                "dspark": _trainer(tmp, tok, "s", spec=DSPARK2),
                "dspark0": _trainer(tmp, tok, "s0", spec=DSPARK2, lam=0.0), "none": _trainer(tmp, tok, "n"),
                "dspark_bf16": _trainer(tmp, tok, "sb", spec=DSPARK2)}
    trainers["dspark_bf16"].update.autocast_dtype = torch.bfloat16     # CPU autocast: the GPU update's path
    batch = trainers["none"].rollout(0)
    batch.rewards = REWARDS.clone()
    adv = group_advantages(batch.rewards, 2)
    payloads = [make_payload(tr.cfg, tr.policy, tr.draft, batch, adv, n_microbatches=2,
                             mask_token_id=tok.mask_id, anchor_seed=3) for tr in trainers.values()]
    payloads[list(trainers).index("dspark_bf16")]["autocast"] = "bfloat16"
    # two steps of a block draft: the second sees the policy's updated embedding (synced to the last stage);
    # with a draft lr warm-up, so each rank's ramp must follow its own optimizer's count as JointUpdate's does
    two = _trainer(tmp, tok, "s2", spec=dataclasses.replace(DSPARK2, lr_warmup_steps=3))
    batch2 = trainers["none"].rollout(2)         # its longest microbatch is longer than the first batch's
    batch2.rewards = torch.tensor([0.0, 1.0, 1.0, 0.0])
    adv2 = group_advantages(batch2.rewards, 2)
    # taps over the p2p transport; the second batch is the longer one, so the channels reopen with larger
    # slots at step 1 and the point-to-point stream restarts at that step's first stamp
    payloads.append(make_payload(two.cfg, two.policy, two.draft, batch, adv, n_microbatches=2,
                                 mask_token_id=tok.mask_id, anchor_seed=3, transport="p2p"))
    payloads[-1]["more"] = [{"ids": batch2.input_ids, "att": batch2.attention_mask, "mask": batch2.loss_mask,
                             "old": batch2.rollout_logp, "adv": adv2, "anchor_seed": 4}]
    refs = {k: _reference(tr, batch, adv) for k, tr in trainers.items()
            if k in ("eagle3", "dspark", "dspark_bf16")}
    two.update.step(batch, adv, anchor_seed=3)
    refs["dspark_2steps"] = _reference(two, batch2, adv2, anchor_seed=4)
    ranks = spawn(mesh_update_worker, 4, args=(payloads, 2, 2), timeout_s=280)
    got = {k: [r[i] for r in ranks] for i, k in enumerate([*trainers, "dspark_2steps"])}
    return refs, got, batch


def _close(a, b, scale, what):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * scale, msg=what)


@pytest.mark.parametrize("draft", ["eagle3", "dspark", "dspark_2steps"])
def test_pp2_cp2_update_equals_single_process(runs, draft):
    refs, got, _ = runs
    ref, ranks = refs[draft], got[draft]
    assert [r["coords"] for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    scale = max(float(g.abs().max()) for g in ref["grads"].values())
    assert scale > 0, "the reference update had no gradient"
    names = {n for r in ranks if r["coords"][1] == 0 for n in r["grads"]}
    assert names == set(ref["grads"]), "the stages lost or invented parameters"
    for r in ranks:
        # Adam's first step is ~lr * sign(grad): gradients are where tolerances mean something
        for k, g in r["grads"].items():
            _close(g, ref["grads"][k], scale, f"rank {r['rank']}: policy grad {k}")
        for k, p in r["policy"].items():      # lr = 1e-3 moves each parameter by ~1e-3
            torch.testing.assert_close(p, ref["policy"][k], rtol=0, atol=1e-5,
                                       msg=f"rank {r['rank']}: param {k}")
    for a, b in ((ranks[0], ranks[1]), (ranks[2], ranks[3])):         # CP ranks of a stage stay identical
        assert all(torch.equal(a["policy"][k], b["policy"][k]) for k in a["policy"])
    dscale = max(float(g.abs().max()) for g in ref["draft_grads"].values())
    for r in ranks[2:]:                                                # the draft lives on the last stage
        assert set(r["draft_grads"]) == set(ref["draft_grads"])
        for k, g in r["draft_grads"].items():
            _close(g, ref["draft_grads"][k], dscale, f"rank {r['rank']}: draft grad {k}")
        for k, p in ref["draft"].items():
            torch.testing.assert_close(r["draft"][k], p, rtol=0, atol=1e-5, msg=f"draft param {k}")
    assert ranks[0]["draft"] is None and ranks[1]["draft"] is None
    st, rs = ranks[0]["stats"], ref["stats"]
    assert st["policy_loss"] == pytest.approx(rs.policy_loss, rel=1e-5, abs=1e-6)
    assert st["draft_loss"] == pytest.approx(rs.draft_loss, rel=1e-5) and rs.draft_loss > 0
    assert st["policy_grad_norm"] == pytest.approx(rs.policy_grad_norm, rel=1e-5)
    assert st["draft_grad_norm"] == pytest.approx(rs.draft_grad_norm, rel=1e-5)
    assert st["tap_wait_s"] > 0, "a tap crosses stages: the draft stage must have read the channel"
    pol, dr = ranks[0]["gathered"]                                     # what rank 0 pushes to the engine
    assert set(pol) == set(ref["policy"]) and set(dr) == set(ref["draft"])
    for k, p in pol.items():
        torch.testing.assert_close(p, ref["policy"][k], rtol=0, atol=1e-5, msg=f"gathered {k}")
    for k, p in dr.items():
        torch.testing.assert_close(p, ref["draft"][k], rtol=0, atol=1e-5, msg=f"gathered draft {k}")
    assert all(r["gathered"] is None for r in ranks[1:])


def _rel_err(a: dict, b: dict) -> float:
    """|a - b| / |b| over a's tensors (one stage's share of b's)."""
    diff = torch.stack([(a[k] - b[k]).norm() for k in a]).norm()
    return float(diff / torch.stack([b[k].norm() for k in a]).norm())


def test_bf16_autocast_update_matches_single_process_within_bf16_rounding(runs):
    """Under autocast (the GPU path) the mesh's forward passes and its ring attention run in bf16: the update
    agrees with JointUpdate under the same autocast to bf16 rounding, and differs from the fp32 update (so the
    autocast took effect on the mesh)."""
    refs, got, _ = runs
    ref, ranks, fp32 = refs["dspark_bf16"], got["dspark_bf16"], got["dspark"]
    for r, r32 in zip(ranks, fp32):
        # seen: 0.005
        assert _rel_err(r["grads"], ref["grads"]) < 2e-2, f"rank {r['rank']}: policy grads off"
        assert _rel_err(r["grads"], r32["grads"]) > 1e-4, \
            f"rank {r['rank']}: grads equal fp32's: no autocast?"
    for r in ranks[2:]:
        assert _rel_err(r["draft_grads"], ref["draft_grads"]) < 2e-2, f"rank {r['rank']}: draft grads off"
    st, rs = ranks[0]["stats"], ref["stats"]
    assert st["draft_loss"] == pytest.approx(rs.draft_loss, rel=2e-2)
    assert st["policy_grad_norm"] == pytest.approx(rs.policy_grad_norm, rel=3e-2)


def test_lambda0_policy_update_is_bitwise_the_no_draft_one(runs):
    _, got, _ = runs
    for co, base in zip(got["dspark0"], got["none"]):
        assert base["policy"].keys() == co["policy"].keys()
        for k in base["policy"]:
            assert torch.equal(co["policy"][k], base["policy"][k]), f"rank {co['rank']}: {k} differs"
        assert co["stats"]["policy_loss"] == base["stats"]["policy_loss"]
    moved = [k for k in got["dspark0"][0]["policy"] if not torch.equal(got["dspark0"][0]["policy"][k],
                                                                       got["dspark"][0]["policy"][k])]
    assert not moved, f"lambda only weighs the draft (stop-gradient): the policy moved at {moved[:3]}"
    st = got["dspark0"][0]["stats"]
    assert st["draft_loss"] > 0 and st["draft_grad_norm"] == 0.0, "lambda = 0: the draft gets no gradient"


def test_mesh_shape_checks_name_the_bad_value(tmp_path):
    cfg = tiny_config(tmp_path)
    with pytest.raises(ConfigError, match=r"pp\*cp=2\*2=4 is invalid: expected the world size 2"):
        MeshShape(2, 2).check(2, cfg, 8)
    with pytest.raises(ConfigError, match="pp=16 is invalid: the policy has 8 decoder layers"):
        MeshShape(16, 1).check(16, cfg, 8)
    with pytest.raises(ConfigError, match="grpo.microbatch=4 is invalid with pp=2"):
        big = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, microbatch=4))
        MeshShape(2, 1).check(2, big, 8)
    with pytest.raises(ConfigError, match="grpo.kl_coef=0.1 is invalid"):
        MeshShape(1, 2).check(2, dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, kl_coef=0.1)), 8)
    with pytest.raises(ConfigError, match="cp=0 is invalid"):
        MeshShape(1, 0).check(0, cfg, 8)
