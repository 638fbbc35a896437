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
