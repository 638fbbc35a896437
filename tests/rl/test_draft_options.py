"""The draft's training-attention backend is a config option of every family, checked before any model exists.

    .venv/bin/python -m pytest -q tests/rl/test_draft_options.py
"""
import dataclasses

import pytest
import torch

from repro.core.specs import ConfigError, DraftSpec
from repro.models.policy import build_policy
from repro.parallel.draft_interface import DraftBatch, TargetFeatures
from repro.rl.drafts import build_draft
from repro.rl.joint import draft_loss_mask

SPECS = {"eagle3": DraftSpec(family="eagle3", num_proposals=2, options={"ttt_steps": 2}),
         "dflash": DraftSpec(family="dflash", num_proposals=3, options={"block_size": 4, "num_layers": 1}),
         "dspark": DraftSpec(family="dspark", num_proposals=4, options={"block_size": 4, "num_layers": 1})}


@pytest.mark.parametrize("family", sorted(SPECS))
def test_attn_backend_option_reaches_the_draft_and_changes_nothing_numerically(family):
    policy = build_policy("qwen3", "tiny", seed=0, dtype=torch.float64, vocab_size=64)
    ids = torch.randint(1, 62, (2, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 24)
    losses = {}
    for backend in ("auto", "torch"):
        spec = dataclasses.replace(SPECS[family], options={**SPECS[family].options, "attn_backend": backend})
        torch.manual_seed(0)
        draft = build_draft(spec, policy, mask_token_id=63).double()
        assert draft.attn_backend == backend
        out = policy.forward_train(ids, want_taps=True)
        feats = TargetFeatures(dict(zip(policy.tap_spec.as_output_layers(), [t.detach() for t in out.taps])))
        batch = DraftBatch(input_ids=ids, loss_mask=draft_loss_mask(mask), policy_logits=out.logits.detach(),
                           extras={"anchor_generator": torch.Generator().manual_seed(1)})
        losses[backend] = float(draft.draft_loss(feats, batch).detach())
    assert losses["auto"] == pytest.approx(losses["torch"], rel=1e-10, abs=1e-12)


def test_bad_attn_backend_is_refused_with_the_choices():
    spec = dataclasses.replace(SPECS["dflash"], options={"block_size": 4, "attn_backend": "triton"})
    with pytest.raises(ConfigError, match="attn_backend='triton'.*flex"):
        spec.validate()


def test_eagle3_draft_vocabulary_keeps_the_most_written_tokens_and_reaches_the_proposer(tmp_path, tok):
    """``draft_vocab_size`` keeps the most frequent tokens of the demonstrations (counts from repro.rl.sft); the
    co-trainer's rollout draft and its proposer read the same maps as the trained draft, and an update trains it."""
    from repro.rl.grpo import group_advantages
    from repro.rl.sft import draft_token_counts
    from repro.rl.trainer import CoTrainer
    from tests.rl.conftest import tiny_config
    cfg = tiny_config(tmp_path, draft="eagle3")
    cfg.draft = dataclasses.replace(cfg.draft, options={**cfg.draft.options, "draft_vocab_size": 24})
    counts = draft_token_counts(cfg.draft, tok, "math", 0, cfg.vocab_size)
    assert int((counts > 0).sum()) > 10, "the demonstrations write too few distinct tokens to test the ranking"
    tr = CoTrainer(cfg, tok)
    kept = tr.draft.t2d.nonzero().flatten()
    assert tr.draft.lm_head.out_features == 24 and kept.numel() == 24
    assert int(counts[kept].min()) >= int(counts[~tr.draft.t2d].max()), "a kept token is rarer than a dropped one"
    assert torch.equal(tr.rollout_draft.t2d, tr.draft.t2d) and torch.equal(tr.rollout_draft.d2t, tr.draft.d2t)
    assert torch.equal(tr.engine.proposer.target_ids.cpu(), kept)
    batch = tr.rollout(0)
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    before = tr.draft.lm_head.weight.detach().clone()
    assert tr.update.step(batch, group_advantages(batch.rewards, 2)).draft_loss > 0
    assert not torch.equal(before, tr.draft.lm_head.weight)


def test_eagle3_draft_vocabulary_bad_values_are_refused():
    for bad in (-1, True, 2.5):
        spec = dataclasses.replace(SPECS["eagle3"], options={"ttt_steps": 2, "draft_vocab_size": bad})
        with pytest.raises(ConfigError, match="draft_vocab_size"):
            spec.validate()
    policy = build_policy("qwen3", "tiny", seed=0, vocab_size=64)
    spec = dataclasses.replace(SPECS["eagle3"], options={"ttt_steps": 2, "draft_vocab_size": 65})
    with pytest.raises(ValueError, match=r"draft_vocab_size must be in \[1, 64\].*got 65"):
        build_draft(spec, policy, mask_token_id=63)
