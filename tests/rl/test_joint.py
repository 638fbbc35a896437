"""The joint update's stop-gradient: the draft's loss never changes the policy.

With lambda = 0 and with lambda = 1, the co-trained policy's parameters after each update equal the
no-draft baseline's bit for bit (same rollout batch, same schedule), for all three draft families,
while the draft itself trains only when lambda > 0. Negative control: a block draft attached to the
policy's live head *without* the stop-gradient view changes the policy, so the check can fail.

    .venv/bin/python -m pytest -q tests/rl/test_joint.py
"""
import dataclasses

import pytest
import torch

from repro.rl.grpo import clipped_policy_loss, group_advantages, token_logprobs, train_inference_kl
from repro.rl.trainer import CoTrainer
from tests.rl.conftest import tiny_config

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0])     # 2 prompts x 2 samples: nonzero advantages


def _trainer(tmp_path, tok, draft, lam):
    cfg = tiny_config(tmp_path / f"{draft}-{lam}", draft=draft)
    if draft:
        cfg.draft = dataclasses.replace(cfg.draft, loss_weight=lam)
    return CoTrainer(cfg, tok)


def _policy_state(tr):
    return {k: v.detach().clone() for k, v in tr.policy.model.state_dict().items()}


def _update(tr, batch, step):
    adv = group_advantages(batch.rewards, 2)
    return tr.update.step(batch, adv, anchor_seed=step)


def _run_pair(tmp_path, tok, draft, lam, steps=2, break_stop_grad=False):
    base = _trainer(tmp_path, tok, None, 0.0)
    co = _trainer(tmp_path, tok, draft, lam)
    if break_stop_grad:
        co.draft.attach(co.policy)                  # the live head, gradient NOT stopped
    init = _policy_state(base)
    d0 = {k: v.clone() for k, v in co.draft.state_dict().items()}
    for step in range(steps):
        batch = base.rollout(step)
        batch.rewards = REWARDS.clone()
        _update(base, batch, step)
        stats = _update(co, batch, step)
        assert stats.draft_loss > 0
    return init, _policy_state(base), _policy_state(co), d0, co.draft.state_dict()


@pytest.mark.parametrize("draft", ["eagle3", "dflash", "dspark"])
@pytest.mark.parametrize("lam", [0.0, 1.0])
def test_policy_update_is_bitwise_the_baseline(tmp_path, tok, draft, lam):
    init, base, co, d0, d1 = _run_pair(tmp_path, tok, draft, lam)
    assert any(not torch.equal(init[k], base[k]) for k in init), "the baseline update changed nothing"
    for k in base:
        assert torch.equal(base[k], co[k]), f"{draft} lambda={lam}: policy parameter {k} differs from baseline"
    trained = any(not torch.equal(d0[k], d1[k]) for k in d0)
    assert trained == (lam > 0), f"{draft} lambda={lam}: draft trained={trained}"


def test_negative_control_without_stop_gradient_changes_the_policy(tmp_path, tok):
    _, base, co, _, _ = _run_pair(tmp_path, tok, "dflash", 1.0, steps=1, break_stop_grad=True)
    assert not torch.equal(base["lm_head.weight"], co["lm_head.weight"])


@pytest.mark.parametrize("draft", ["eagle3", "dflash", "dspark"])
def test_autocast_update_trains_and_keeps_the_stop_gradient(tmp_path, tok, draft):
    """bf16 autocast (the GPU profiles' update): every family's draft path runs under it, the draft trains,
    and with lambda = 0 and lambda = 1 the policy update still equals the autocast no-draft update bit for bit."""
    base = _trainer(tmp_path, tok, None, 0.0)
    co = _trainer(tmp_path, tok, draft, 0.0)
    co1 = _trainer(tmp_path / "l1", tok, draft, 1.0)
    for tr in (base, co, co1):
        tr.update.autocast_dtype = torch.bfloat16
    d0 = {k: v.clone() for k, v in co1.draft.state_dict().items()}
    batch = base.rollout(0)
    batch.rewards = REWARDS.clone()
    _update(base, batch, 0)
    _update(co, batch, 0)
    stats = _update(co1, batch, 0)
    assert torch.isfinite(torch.tensor(stats.draft_loss)) and stats.draft_loss > 0
    b = _policy_state(base)
    for lam, tr in ((0, co), (1, co1)):
        c = _policy_state(tr)
        for k in b:
            assert torch.equal(b[k], c[k]), f"{draft} under autocast, lambda={lam}: policy parameter {k} differs"
    assert any(not torch.equal(d0[k], v) for k, v in co1.draft.state_dict().items()), "the draft did not train"


def test_autocast_dtype_is_checked():
    from repro.rl.joint import JointUpdate
    with pytest.raises(ValueError, match="autocast_dtype"):
        JointUpdate(torch.nn.Linear(2, 2), None, None, None, autocast_dtype=torch.float64)


@pytest.mark.parametrize("draft", ["eagle3", "dflash"])
def test_update_statistics_are_the_whole_batch_values(tmp_path, tok, draft):
    """The update sums its statistics over its microbatches on the device and reads them once: the policy loss, the
    train-inference KL, the clip fraction, both gradient norms and the draft's loss equal those of one pass over the
    whole batch with the pre-update weights (rollout log-probabilities perturbed so that KL and clipping are far
    from zero)."""
    tr = _trainer(tmp_path, tok, draft, 1.0)
    batch = tr.rollout(0)
    batch.rewards = REWARDS.clone()
    assert tr.cfg.grpo.microbatch < batch.size, "the test needs more than one policy microbatch"
    batch.rollout_logp = batch.rollout_logp + 0.3 * torch.randn(batch.rollout_logp.shape,
                                                                generator=torch.Generator().manual_seed(0))
    adv = group_advantages(batch.rewards, 2)
    n = float(batch.loss_mask.sum())
    out = tr.policy.forward_train(batch.input_ids, want_taps=True, attention_mask=batch.attention_mask)
    logp = token_logprobs(out.logits, batch.input_ids)
    loss, st = clipped_policy_loss(logp, batch.rollout_logp, adv, batch.loss_mask, n, tr.cfg.grpo.clip_eps)
    dl = tr.update._draft_loss(batch.input_ids, batch.loss_mask, out.logits.detach(), out.taps,
                               torch.Generator().manual_seed(0))
    (loss + dl).backward()
    norms = [float(torch.nn.utils.get_total_norm([q.grad for q in group if q.grad is not None]))
             for group in (tr.update.policy_params, tr.update.draft_params)]
    tr.update.optimizer.zero_grad(set_to_none=True)

    stats = _update(tr, batch, 0)
    assert st["clip_frac"] > 0
    assert stats.policy_loss == pytest.approx(float(loss.detach()), rel=1e-5)
    assert stats.train_inference_kl == pytest.approx(train_inference_kl(logp.detach(), batch.rollout_logp,
                                                                        batch.loss_mask), rel=1e-5)
    assert stats.clip_frac == pytest.approx(float(st["clip_frac"]) / n, rel=1e-6)
    assert stats.policy_grad_norm == pytest.approx(norms[0], rel=1e-4)
    assert stats.draft_grad_norm > 0 and stats.draft_loss > 0
    if draft == "eagle3":        # the block drafts draw their anchors per call, so only EAGLE-3's loss is the same
        assert stats.draft_loss == pytest.approx(float(dl), rel=1e-5)
        assert stats.draft_grad_norm == pytest.approx(norms[1], rel=1e-4)
    assert stats.draft_time_s > 0


@pytest.mark.parametrize("draft", ["eagle3", "dspark"])
def test_deferred_draft_keeps_the_stop_gradient_and_equals_one_call(tmp_path, tok, draft):
    """draft.microbatch > grpo.microbatch: the draft runs after the policy's microbatches over the kept taps.
    The policy update is still the baseline's bit for bit, and with one draft call over the whole batch the
    draft's update equals the in-microbatch path's when that path also sees the whole batch at once."""
    base = _trainer(tmp_path, tok, None, 0.0)
    deferred = _trainer(tmp_path / "deferred", tok, draft, 1.0)
    whole = _trainer(tmp_path / "whole", tok, draft, 1.0)
    batch = base.rollout(0)
    batch.rewards = REWARDS.clone()
    B = batch.size
    assert deferred.cfg.grpo.microbatch < B, "the test needs more than one policy microbatch"
    deferred.update.draft_spec = dataclasses.replace(deferred.update.draft_spec, microbatch=B)
    assert deferred.update._defers_draft(deferred.cfg.grpo.microbatch)
    whole.update.grpo = dataclasses.replace(whole.update.grpo, microbatch=B)      # one microbatch, draft inside
    whole.draft.load_state_dict(deferred.draft.state_dict())
    _update(base, batch, 0)
    s_def = _update(deferred, batch, 0)
    s_whole = _update(whole, batch, 0)
    b, c = _policy_state(base), _policy_state(deferred)
    for k in b:
        assert torch.equal(b[k], c[k]), f"{draft} deferred: policy parameter {k} differs from baseline"
    assert s_def.draft_loss == pytest.approx(s_whole.draft_loss, rel=1e-6)
    for (k, v), w in zip(deferred.draft.state_dict().items(), whole.draft.state_dict().values()):
        torch.testing.assert_close(v, w, rtol=1e-5, atol=1e-6, msg=f"{draft} deferred vs whole: draft {k}")


def test_draft_microbatch_is_checked(tmp_path):
    cfg = tiny_config(tmp_path, draft="dflash")
    cfg.draft = dataclasses.replace(cfg.draft, microbatch=max(1, cfg.grpo.microbatch - 1))
    if cfg.draft.microbatch < cfg.grpo.microbatch:
        with pytest.raises(Exception, match="draft.microbatch"):
            cfg.validate()
    cfg.draft = dataclasses.replace(cfg.draft, microbatch=-1)
    with pytest.raises(Exception, match="draft.microbatch"):
        cfg.validate()


def _draft_lrs(tmp_path, tok, warmup, steps, resume_after=None):
    """The draft group's learning rate at each of ``steps`` updates (after a resume from the optimizer's state
    at ``resume_after``, in a fresh trainer), and the policy group's."""
    cfg = tiny_config(tmp_path / f"w{warmup}-{resume_after}", draft="dflash")
    cfg.draft = dataclasses.replace(cfg.draft, lr=1e-3, lr_warmup_steps=warmup)
    tr = CoTrainer(cfg, tok)
    lrs, policy_lrs = [], []
    for step in range(steps):
        if step == resume_after:
            fresh = CoTrainer(cfg, tok)
            fresh.update.optimizer.load_state_dict(tr.update.optimizer.state_dict())
            tr = fresh
        batch = tr.rollout(step)
        batch.rewards = REWARDS.clone()
        _update(tr, batch, step)
        groups = {g["name"]: g["lr"] for g in tr.update.optimizer.param_groups}
        lrs.append(groups["draft"])
        policy_lrs.append(groups["policy"])
    return lrs, policy_lrs


def test_draft_lr_warms_up_linearly_and_resumes_the_ramp(tmp_path, tok):
    lrs, policy_lrs = _draft_lrs(tmp_path, tok, warmup=4, steps=6)
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert set(policy_lrs) == {tiny_config(tmp_path).grpo.lr}, "the warm-up touched the policy's group"
    resumed, _ = _draft_lrs(tmp_path, tok, warmup=4, steps=6, resume_after=2)
    assert resumed == pytest.approx(lrs), "a resumed run restarted the draft's warm-up"
    constant, _ = _draft_lrs(tmp_path, tok, warmup=0, steps=2)
    assert constant == [1e-3, 1e-3]


@pytest.mark.parametrize("bad", [-1, 2.5, True])
def test_draft_lr_warmup_is_checked(tmp_path, bad):
    cfg = tiny_config(tmp_path, draft="dflash")
    with pytest.raises(ValueError, match="lr_warmup_steps"):    # a wrong type when built, a bad value when validated
        cfg.draft = dataclasses.replace(cfg.draft, lr_warmup_steps=bad)
        cfg.validate()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("draft", [None, "eagle3"])
def test_compiled_update_forward_equals_the_eager_update(tmp_path, tok, draft, monkeypatch):
    """grpo.compile_layers: the update's decoder layers run compiled (here on AOTAutograd without codegen; inductor
    on a GPU run), taps and backward included: the policy and the draft after two updates equal the eager ones."""
    from repro.rl import joint
    from repro.rl.joint import JointUpdate
    from repro.rollout import compiled_layers as cl

    monkeypatch.setattr(JointUpdate, "COMPILE_BACKEND", "aot_eager")
    monkeypatch.setattr(joint, "LENGTH_MULTIPLE", 1)     # no padding: the compiled path alone (padding: below)
    eager = _trainer(tmp_path / "eager", tok, draft, 1.0)
    cfg = tiny_config(tmp_path / "compiled", draft=draft)
    cfg.grpo = dataclasses.replace(cfg.grpo, compile_layers=True)
    compiled = CoTrainer(cfg, tok)
    assert compiled.update.grpo.compile_layers and not eager.update.grpo.compile_layers
    for step in range(2):
        batch = eager.rollout(step)
        batch.rewards = REWARDS.clone()
        _update(eager, batch, step)
        _update(compiled, batch, step)
    layer_cls = type(compiled.policy.decoder_layers()[0])
    assert (layer_cls, "aot_eager", "train") in cl._COMPILED          # the compiled path ran
    assert "forward" not in vars(compiled.policy.decoder_layers()[0])   # and the layers are their own again
    a, b = _policy_state(eager), _policy_state(compiled)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=lambda m: f"policy {k}: {m}")
    if draft:
        for k, v in eager.draft.state_dict().items():
            torch.testing.assert_close(compiled.draft.state_dict()[k], v, rtol=1e-5, atol=1e-6)


def test_compile_layers_is_refused_by_the_mesh_update(tmp_path):
    from repro.core.specs import ConfigError
    from repro.rl.mesh_update import MeshShape

    cfg = tiny_config(tmp_path, draft=None)
    cfg.grpo = dataclasses.replace(cfg.grpo, compile_layers=True)
    with pytest.raises(ConfigError, match="grpo.compile_layers=True is invalid under the PP x CP update"):
        MeshShape(1, 2).check(2, cfg, 8)


@pytest.mark.timeout(120)
def test_compile_layers_leaves_an_fp32_moe_update_eager(tmp_path, tok, capsys):
    """Without autocast (the CPU profile's fp32 update) an MoE policy's update runs eagerly under
    grpo.compile_layers (its fp32 expert GEMMs sync the host per expert, breaking inductor's graph), saying so; a
    dense policy's compiles."""
    cfg = tiny_config(tmp_path / "moe", draft=None, family="qwen3_moe")
    cfg.grpo = dataclasses.replace(cfg.grpo, compile_layers=True)
    moe = CoTrainer(cfg, tok)
    assert moe.policy.has_experts and moe.update.autocast_dtype is None and not moe.update.compile_layers
    assert "the MoE policy's update runs eagerly" in capsys.readouterr().err
    dense_cfg = tiny_config(tmp_path / "dense", draft=None)
    dense_cfg.grpo = dataclasses.replace(dense_cfg.grpo, compile_layers=True)
    dense = CoTrainer(dense_cfg, tok)
    assert not dense.policy.has_experts and dense.update.compile_layers


@pytest.mark.timeout(300)
def test_bf16_autocast_moe_update_compiles_and_equals_the_eager_one(tmp_path, tok, monkeypatch):
    """Under bf16 autocast an MoE policy whose experts run grouped_mm_autocast has its layers compiled by the
    update (here on AOTAutograd without codegen), and two compiled updates leave the policy where two eager ones
    do; with another experts implementation (fp32 GEMMs under the same autocast) the update stays eager."""
    from repro.models.moe_experts import AUTOCAST_EXPERTS
    from repro.rl import joint
    from repro.rl.joint import JointUpdate
    from repro.rollout import compiled_layers as cl

    monkeypatch.setattr(JointUpdate, "COMPILE_BACKEND", "aot_eager")
    monkeypatch.setattr(joint, "LENGTH_MULTIPLE", 1)     # no padding: the compiled path alone
    cfg = tiny_config(tmp_path / "moe", draft=None, family="qwen3_moe")
    cfg.grpo = dataclasses.replace(cfg.grpo, compile_layers=True)
    eager, compiled = CoTrainer(cfg, tok), CoTrainer(cfg, tok)
    assert eager.policy.model.config._experts_implementation == AUTOCAST_EXPERTS
    compiled.update = JointUpdate(compiled.policy, None, cfg.grpo, None, autocast_dtype=torch.bfloat16)
    eager.update = JointUpdate(eager.policy, None, dataclasses.replace(cfg.grpo, compile_layers=False), None,
                               autocast_dtype=torch.bfloat16)
    assert compiled.update.compile_layers and not eager.update.compile_layers
    init = _policy_state(eager)
    for step in range(2):
        batch = eager.rollout(step)
        batch.rewards = REWARDS.clone()
        _update(eager, batch, step)
        _update(compiled, batch, step)
    assert (type(compiled.policy.decoder_layers()[0]), "aot_eager", "train") in cl._COMPILED
    a, b = _policy_state(eager), _policy_state(compiled)
    assert any(not torch.equal(v, init[k]) for k, v in a.items())          # the updates moved the policy
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"policy {k}: {m}")
    eager.policy.model.set_experts_implementation("batched_mm")
    assert not JointUpdate(eager.policy, None, cfg.grpo, None, autocast_dtype=torch.bfloat16).compile_layers


@pytest.mark.timeout(300)
def test_compiled_update_makes_its_graph_in_its_first_update(tmp_path, tok, monkeypatch):
    """grpo.compile_layers: a microbatch with padding (on the right, as every rollout batch) and one without both
    reach the compiled layers without a mask. The graph is made in the run's first update, so no later update
    recompiles (dynamo's error_on_recompile) whichever kind of microbatch it meets."""
    from repro.rl.joint import JointUpdate
    from repro.rollout import compiled_layers as cl

    monkeypatch.setattr(JointUpdate, "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(cl, "_COMPILED", {})         # a compilation of its own, whatever this process ran before
    torch._dynamo.reset()
    cfg = tiny_config(tmp_path, draft="eagle3")
    cfg.grpo = dataclasses.replace(cfg.grpo, compile_layers=True)
    tr = CoTrainer(cfg, tok)
    padded = tr.rollout(0)
    padded.rewards = REWARDS.clone()
    padded.attention_mask[:, -1] = 0                 # every microbatch padded
    padded.loss_mask[:, -1] = 0
    _update(tr, padded, 0)
    unpadded = dataclasses.replace(padded, attention_mask=torch.ones_like(padded.attention_mask))
    with torch._dynamo.config.patch(error_on_recompile=True):
        _update(tr, unpadded, 1)
        _update(tr, padded, 2)


def _right_padded_batch(rows: int, length: int, seed: int):
    from repro.rl.episodes import RolloutBatch
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(length // 2, length + 1, (rows,), generator=g)
    lens[0] = length
    att = torch.arange(length)[None] < lens[:, None]
    ids = torch.randint(1, 300, (rows, length), generator=g) * att
    loss_mask = att.float()
    loss_mask[:, :4] = 0
    return RolloutBatch(ids, att, loss_mask, -2.0 * loss_mask, torch.zeros(rows), None, int(loss_mask.sum()), 1.0)


@pytest.mark.timeout(300)
def test_an_update_prepared_at_the_runs_shape_is_not_compiled_again(monkeypatch):
    """``prepare(rows, length)`` compiles the update's graph (inductor, as on a GPU) at the shape of the run's
    microbatches, and updates on batches of the run's sizes reuse it (dynamo's error_on_recompile). Inductor guards
    its graph on choices made from the first call's sizes: on a CPU, ``2 * rows * length <= 4096`` after a call of
    3 x 11 tokens, which a batch of 16 x 150 fails."""
    from repro.core.specs import GRPOSpec, PolicySpec
    from repro.rl.joint import JointUpdate
    from repro.rl.warmstart import make_policy
    from repro.rollout import compiled_layers as cl

    monkeypatch.setattr(cl, "_COMPILED", {})
    torch._dynamo.reset()
    policy = make_policy(PolicySpec("qwen3", "tiny", {"num_hidden_layers": 2}), 300, seed=0, dtype=torch.float32,
                         device="cpu")
    grpo = GRPOSpec(prompts_per_step=2, generations_per_prompt=8, max_new_tokens=10, microbatch=16, lr=1e-4,
                    compile_layers=True)
    update = JointUpdate(policy, None, grpo, None)
    update.prepare(16, 170)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed, length in enumerate((150, 170, 131)):
            update.step(_right_padded_batch(16, length, seed), torch.randn(16))


def test_compile_shape_is_near_the_given_one_and_ties_no_size():
    """The compile shape moves off every size of the policy's config and off the other dimension (dynamo's duck
    sizing would tie them into one symbol), and keeps at least 2 (0 and 1 are specialised)."""
    from repro.core.specs import GRPOSpec, PolicySpec
    from repro.rl.joint import JointUpdate
    from repro.rl.warmstart import make_policy

    policy = make_policy(PolicySpec("qwen3", "tiny", {}), 300, seed=0, dtype=torch.float32, device="cpu")
    update = JointUpdate(policy, None, GRPOSpec(compile_layers=True), None)
    cfg = policy.model.config
    assert cfg.hidden_size == 64 and cfg.head_dim == 16
    assert update.compile_shape(64, 64) == (65, 72)           # hidden 64 taken: the next multiple of 8
    assert update.compile_shape(16, 200) == (17, 200)         # head_dim 16
    assert update.compile_shape(40, 250) == (40, 256)         # 250 rounded up to a multiple of 8
    sizes = {cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads,
             cfg.vocab_size, cfg.num_hidden_layers}
    for rows, length in ((1, 1), (2, 2), (4, 16), (300, 300)):
        r, n = update.compile_shape(rows, length)
        assert r >= max(2, rows) and n >= max(2, length) and r != n and not {r, n} & sizes, (rows, length, r, n)
        assert n % 8 == 0, (rows, length, n)


def test_the_update_pads_its_rows_to_a_multiple_of_8_and_that_changes_nothing(monkeypatch):
    """The compiled update's policy forward sees every batch at a length that is a multiple of 8 (inductor's CUDA
    graphs guard on it), and the padded update's losses, statistics and new weights are those of the unpadded one."""
    from repro.core.specs import GRPOSpec, PolicySpec
    from repro.rl import joint
    from repro.rl.warmstart import make_policy
    from repro.rollout import compiled_layers as cl

    monkeypatch.setattr(joint.JointUpdate, "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(cl, "_COMPILED", {})
    grpo = GRPOSpec(prompts_per_step=2, generations_per_prompt=4, max_new_tokens=10, microbatch=4, lr=1e-3,
                    compile_layers=True)
    batch, adv = _right_padded_batch(8, 21, 0), torch.randn(8, generator=torch.Generator().manual_seed(1))
    results = {}
    for multiple in (8, 1):
        monkeypatch.setattr(joint, "LENGTH_MULTIPLE", multiple)
        policy = make_policy(PolicySpec("qwen3", "tiny", {"num_hidden_layers": 2}), 300, seed=0,
                             dtype=torch.float64, device="cpu")
        seen = []
        forward = policy.forward_train
        monkeypatch.setattr(policy, "forward_train", lambda ids, **kw: seen.append(ids.shape[1]) or forward(ids, **kw))
        stats = joint.JointUpdate(policy, None, grpo, None).step(batch, adv)
        results[multiple] = (stats, [p.detach().clone() for p in policy.parameters()], seen)
    (padded, w_padded, seen8), (plain, w_plain, seen1) = results[8], results[1]
    assert seen8[-2:] == [24, 24] and seen1[-2:] == [21, 21]      # (the first calls: prepare's compile shape)
    # fp64 weights; the log-probabilities are taken in fp32 (repro.rl.grpo.token_logprobs), hence fp32's tolerance
    for key in ("policy_loss", "policy_grad_norm", "train_inference_kl", "clip_frac"):
        assert getattr(padded, key) == pytest.approx(getattr(plain, key), rel=1e-6, abs=1e-9), key
    for a, b in zip(w_padded, w_plain):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)


def test_right_padded_reads_each_row():
    from repro.rl.episodes import right_padded

    assert right_padded(torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool))
    assert not right_padded(torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.bool))      # left padding
    assert not right_padded(torch.tensor([[1, 0, 1]], dtype=torch.bool))                 # a hole


def test_pack_lays_each_row_out_from_the_left_and_pads_the_rest():
    from repro.rl.episodes import _pack

    ids, att, lm, lp = _pack([[5, 6, 7], [8], [9, 10]], [[0.0, 1.0, 1.0], [1.0], [0.0, 1.0]],
                             [[0.0, -0.5, -1.5], [-2.0], [0.0, -0.25]], pad=3)
    assert ids.tolist() == [[5, 6, 7], [8, 3, 3], [9, 10, 3]] and ids.dtype == torch.long
    assert att.tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    assert lm.tolist() == [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    assert lp.tolist() == [[0.0, -0.5, -1.5], [-2.0, 0.0, 0.0], [0.0, -0.25, 0.0]]
    assert lm.dtype == lp.dtype == torch.float32


@pytest.mark.parametrize("draft", [None, "dspark"])
def test_dropping_the_padding_mask_of_a_right_padded_batch_changes_no_update(tmp_path, tok, draft, monkeypatch):
    """A right-padded batch trains without its padding mask (causal attention alone: SDPA's flash path). The
    update's statistics and the parameters it leaves equal those of the same update given the mask; a batch whose
    padding is not on the right keeps its mask, and dropping that one would change the update."""
    import repro.rl.joint as joint

    def one_update(batch, keep_mask):
        tr = _trainer(tmp_path / f"{keep_mask}-{batch.attention_mask[0, 0].item()}", tok, draft, 1.0)
        if keep_mask:
            monkeypatch.setattr(joint, "right_padded", lambda att: False)
        stats = _update(tr, batch, 0)
        monkeypatch.undo()
        return stats, _policy_state(tr)

    batch = _trainer(tmp_path / "rollout", tok, None, 0.0).rollout(0)
    batch.rewards = REWARDS.clone()
    T = batch.input_ids.shape[1]
    for row, cut in enumerate((0, 7, 3, 12)):          # ragged rows: the tails padded
        batch.attention_mask[row, T - cut:] = False
        batch.loss_mask[row, T - cut:] = 0
        batch.input_ids[row, T - cut:] = 0
    lengths = batch.attention_mask.sum(1)
    assert joint.right_padded(batch.attention_mask)
    (s_drop, p_drop), (s_keep, p_keep) = one_update(batch, False), one_update(batch, True)
    assert s_drop.policy_loss == pytest.approx(s_keep.policy_loss, rel=1e-5, abs=1e-7)
    assert s_drop.policy_grad_norm == pytest.approx(s_keep.policy_grad_norm, rel=1e-4)
    assert s_drop.draft_loss == pytest.approx(s_keep.draft_loss, rel=1e-4)
    # Adam's first step moves a weight by lr * g / (|g| + eps): by about lr where the gradient is large, by a
    # fraction of lr that rounding decides where it is near eps (one weight of 2048 moved 1.3e-3 lr apart on a CPU
    # without AVX-512), so the weights agree to a hundredth of the learning rate (the gradients themselves are
    # compared through the norms above)
    lr = tiny_config(tmp_path / "lr").grpo.lr
    for k in p_keep:
        torch.testing.assert_close(p_drop[k], p_keep[k], rtol=1e-5, atol=1e-2 * lr)

    # the same rows left-padded: the mask stays (right_padded is False) and matters
    left = dataclasses.replace(batch, **{name: torch.stack([row.roll(int(row.shape[0] - n)) for row, n in
                                                            zip(getattr(batch, name), lengths)])
                                         for name in ("input_ids", "attention_mask", "loss_mask", "rollout_logp")})
    assert not joint.right_padded(left.attention_mask)
    s_left, _ = one_update(left, False)
    monkeypatch.setattr(joint, "right_padded", lambda att: True)      # negative control: drop it anyway
    tr = _trainer(tmp_path / "wrong", tok, draft, 1.0)
    s_wrong = _update(tr, left, 0)
    assert s_wrong.policy_grad_norm != pytest.approx(s_left.policy_grad_norm, rel=1e-3)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("draft", ["dflash", "eagle3"])
def test_padding_the_compiled_update_leaves_the_drafts_update_alone(tmp_path, tok, draft, monkeypatch):
    """With a draft, the compiled update's padded forward hands the draft its taps and logits at the batch's own
    length: the anchors it draws and the draft it trains are those of the unpadded update (one step each)."""
    from repro.rl import joint
    from repro.rollout import compiled_layers as cl

    monkeypatch.setattr(joint.JointUpdate, "COMPILE_BACKEND", "eager")
    drafts = {}
    for multiple in (8, 1):
        monkeypatch.setattr(joint, "LENGTH_MULTIPLE", multiple)
        monkeypatch.setattr(cl, "_COMPILED", {})
        cfg = tiny_config(tmp_path / f"m{multiple}", draft=draft)
        cfg.grpo = dataclasses.replace(cfg.grpo, compile_layers=True)
        tr = CoTrainer(cfg, tok)
        batch = tr.rollout(0)
        batch.rewards = REWARDS.clone()
        assert batch.input_ids.shape[1] % 8, "the test needs a batch whose length is not a multiple of 8"
        stats = _update(tr, batch, 0)
        drafts[multiple] = (stats.draft_loss, stats.draft_grad_norm,
                            {k: v.detach().clone() for k, v in tr.draft.state_dict().items()})
    (loss8, norm8, w8), (loss1, norm1, w1) = drafts[8], drafts[1]
    assert loss8 == pytest.approx(loss1, rel=1e-5) and norm8 == pytest.approx(norm1, rel=1e-5)
    # fp32: Adam's first step is about lr * sign(grad), so an element whose gradient is near 0 may move by up to
    # 2 lr with a rounding's difference in its gradient; other anchors would change the loss and its gradient norm
    for k, v in w1.items():
        torch.testing.assert_close(w8[k], v, rtol=0, atol=2.5 * tr.cfg.draft.lr, msg=lambda m: f"draft {k}: {m}")
