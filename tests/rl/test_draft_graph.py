"""The drafts' graphed training step (repro.rl.draft_graph) computes the eager step's loss and gradients.

On CPU the step runs eagerly through the same function the GPU records (anchors drawn on the host, rows
padded to the length bucket, loss + autograd.grad, gradients added times the weight), so these tests
check everything but the capture itself: fp64 loss and gradients equal ``(w * draft_loss).backward()``
with and without padding and with accumulation into existing gradients; in a co-training update the
policy stays the baseline's bit for bit and the draft's update equals the eager deferred path's.
The capture itself happens on a GPU only: the GPU profiles' RL runs record it (``train/graph_captures``), and a
failed capture logs a warning in the job's log and runs the step eagerly (``repro.decoding.cuda_graph``).

    .venv/bin/python -m pytest -q tests/rl/test_draft_graph.py
"""
import dataclasses

import pytest
import torch

from repro.core.specs import ConfigError
from repro.models import block_draft
from repro.models.block_draft import BlockDraftConfig, sample_anchors
from repro.models.dflash import DFlashDraft
from repro.models.dspark import DSparkDraft
from repro.models.eagle3 import Eagle3Config, Eagle3Draft
from repro.models.policy import build_policy
from repro.models.train_draft import policy_batch
from repro.rl.draft_graph import DraftTrainStep
from repro.rl.grpo import group_advantages
from repro.rl.joint import draft_loss_mask
from repro.rl.trainer import CoTrainer
from tests.rl.conftest import tiny_config

FAMILIES = {"dflash": DFlashDraft, "dspark": DSparkDraft, "eagle3": Eagle3Draft}


@pytest.fixture(scope="module")
def policy64():
    return build_policy("qwen3", "tiny", seed=5, dtype=torch.float64, init_std=0.3)


def _draft_and_batch(policy, family):
    torch.manual_seed(0)
    if family == "eagle3":
        d = Eagle3Draft(Eagle3Config.from_policy(policy, ttt_steps=3)).to(torch.float64)
    else:
        cfg = BlockDraftConfig.from_policy(policy, num_layers=2, block_size=4, num_anchors=5)
        d = FAMILIES[family](cfg, policy).to(torch.float64)
    policy.set_taps(d.tap_spec)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 127, (n,), generator=g).tolist() for n in (23, 17, 30)]
    feats, batch = policy_batch(policy, seqs, [5, 3, 9])
    return d, feats, batch


def _grads(d):
    return {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("bucket", [1, 8, 64])
def test_step_equals_eager_loss_and_backward(policy64, family, bucket):
    d, feats, batch = _draft_and_batch(policy64, family)
    w = 0.375
    d.zero_grad(set_to_none=True)
    eager = d.draft_loss(feats,
                         dataclasses.replace(batch, extras={"anchor_generator": torch.Generator().manual_seed(7)}))
    (w * eager).backward()
    want = _grads(d)
    d.zero_grad(set_to_none=True)
    step = DraftTrainStep(d, cuda_graphs=True, seq_bucket=bucket)        # CPU: eager through the same function
    got = step(batch.input_ids, batch.loss_mask, batch.policy_logits, feats.concat(d.tap_layers),
               torch.Generator().manual_seed(7), weight=w)
    assert step.status()["eager_calls"] == 1 and step.status()["captures"] == 0
    # one memory pool for every sequence bucket's graph: the outputs (loss, gradients) are read before the next call
    assert step.graph.shared_pool
    torch.testing.assert_close(got, eager.detach(), rtol=0, atol=1e-12)
    have = _grads(d)
    assert have.keys() == want.keys() and len(have) > 5
    for n in want:
        torch.testing.assert_close(have[n], want[n], rtol=0, atol=1e-12, msg=n)
    step(batch.input_ids, batch.loss_mask, batch.policy_logits, feats.concat(d.tap_layers),   # accumulates
         torch.Generator().manual_seed(7), weight=w)
    for n in want:
        torch.testing.assert_close(d.get_parameter(n).grad, 2 * want[n], rtol=0, atol=1e-12, msg=n)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("family", ["dspark", "eagle3"])
def test_step_under_autocast_equals_eager_autocast(policy64, family):
    """bf16 autocast (the GPU profiles' update) is a setting of the call: same loss and grads as the eager
    loss (on the same padded route) under the same autocast."""
    d, feats, batch = _draft_and_batch(policy64, family)
    d = d.float()
    taps = feats.concat(d.tap_layers).float()
    logits = batch.policy_logits.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if family == "eagle3":
            eager = d.ttt_loss(batch.input_ids, taps, logits, batch.loss_mask, attn_impl="padded")[0]
        else:
            eager = d.loss(batch.input_ids, taps, logits, batch.loss_mask,
                           generator=torch.Generator().manual_seed(3))[0]
    eager.backward()
    want = _grads(d)
    step = DraftTrainStep(d, cuda_graphs=True)
    fp32 = step(batch.input_ids, batch.loss_mask, logits, taps, torch.Generator().manual_seed(3), weight=1.0)
    d.zero_grad(set_to_none=True)
    got = step(batch.input_ids, batch.loss_mask, logits, taps, torch.Generator().manual_seed(3), weight=1.0,
               autocast_dtype=torch.bfloat16)
    # bf16 sums over the 64-token padded keys round differently: equal to ~1e-5, while fp32 is ~1e-3 away
    assert abs(float(fp32) - float(eager.detach())) > 1e-4
    torch.testing.assert_close(got, eager.detach(), rtol=1e-4, atol=0)
    for n, g in _grads(d).items():
        torch.testing.assert_close(g, want[n], rtol=2e-2, atol=2e-3, msg=n)


def test_a_draft_without_a_padded_route_and_a_bad_bucket_are_refused(policy64):
    with pytest.raises(ValueError, match="anchored_loss"):
        DraftTrainStep(torch.nn.Linear(2, 2), cuda_graphs=True)
    d, _, _ = _draft_and_batch(policy64, "dflash")
    with pytest.raises(ValueError, match="seq_bucket"):
        DraftTrainStep(d, cuda_graphs=True, seq_bucket=0)


def test_draft_loss_mask_shift():
    m = torch.tensor([[0, 1, 1, 0]])
    assert draft_loss_mask(m).tolist() == [[1, 1, 0, 0]]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("draft", ["dflash", "dspark", "eagle3"])
def test_graphed_deferred_update_keeps_the_policy_and_equals_eager(tmp_path, tok, draft):
    """The co-training update with ``draft.cuda_graph``: the policy's update is the baseline's bit for bit,
    and the draft's update equals the eager deferred path's (same anchors, same gradients up to rounding)."""
    trainers = {}
    for name, graph in (("base", None), ("eager", False), ("graph", True)):
        cfg = tiny_config(tmp_path / name, draft=None if graph is None else draft)
        if graph is not None:
            cfg.draft = dataclasses.replace(cfg.draft, microbatch=4, cuda_graph=graph)
            cfg.validate()
        trainers[name] = CoTrainer(cfg, tok)
    trainers["graph"].draft.load_state_dict(trainers["eager"].draft.state_dict())
    assert trainers["graph"].update.draft_step is not None and trainers["eager"].update.draft_step is None
    for step in range(2):
        batch = trainers["base"].rollout(step)
        batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
        adv = group_advantages(batch.rewards, 2)
        stats = {k: tr.update.step(batch, adv, anchor_seed=step) for k, tr in trainers.items()}
        assert stats["graph"].draft_loss == pytest.approx(stats["eager"].draft_loss, rel=1e-6)
    base = trainers["base"].policy.model.state_dict()
    for k, v in trainers["graph"].policy.model.state_dict().items():
        assert torch.equal(v, base[k]), f"{draft} graphed: policy parameter {k} differs from the baseline"
    # Adam divides each gradient element by its own running norm: where an element is near Adam's eps, the two paths'
    # rounding (summation orders differ) moves its update by a visible fraction of lr (3.4e-6 of lr 1e-3 for one of
    # EAGLE-3's v_proj elements on an AMD EPYC); a path that differs moves every element by up to lr
    atol = 0.01 * trainers["graph"].cfg.draft.lr
    for (k, v), w in zip(trainers["graph"].draft.state_dict().items(), trainers["eager"].draft.state_dict().values()):
        torch.testing.assert_close(v, w, rtol=1e-5, atol=atol, msg=f"{draft} graphed vs eager: draft {k}")


def test_cuda_graph_option_is_checked(tmp_path):
    cfg = tiny_config(tmp_path, draft="dflash")
    cfg.draft = dataclasses.replace(cfg.draft, cuda_graph=True)          # microbatch 0: not the deferred pass
    with pytest.raises(ConfigError, match="draft.cuda_graph"):
        cfg.validate()
    with pytest.raises(ValueError, match="cuda_graph"):          # a wrong type is refused when the spec is built
        dataclasses.replace(cfg.draft, cuda_graph="yes")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_graphed_loss_has_no_host_sync(policy64, family, monkeypatch):
    """What a CUDA graph records must not wait on the device: the padded loss each family's step runs traces whole
    under dynamo's fullgraph as it runs during a capture (the anchors' bounds check, a read-back, is skipped there;
    a ``.item()``, a bool of a tensor or a boolean-mask index would break the graph and fail here), and the traced
    loss equals the eager one."""
    d, feats, batch = _draft_and_batch(policy64, family)
    step = DraftTrainStep(d, cuda_graphs=True)
    taps = feats.concat(d.tap_layers)
    anchors = () if family == "eagle3" else sample_anchors(batch.loss_mask, d.cfg.num_anchors,
                                                           torch.Generator().manual_seed(2))
    monkeypatch.setattr(block_draft, "capturing", lambda: True)
    torch._dynamo.reset()
    traced = torch.compile(step.loss, fullgraph=True, backend="eager", dynamic=False)
    args = (batch.input_ids, batch.loss_mask, batch.policy_logits, taps, *anchors)
    with torch.no_grad():
        torch.testing.assert_close(traced(*args), step.loss(*args), rtol=0, atol=1e-12)
