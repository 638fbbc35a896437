"""Single-process pieces of the PP harness: layer splitting, stages vs the unsplit transformers
model, the draft contract (tap convention, detached features) and config validation.

    .venv/bin/python -m pytest -q tests/parallel/test_model_and_contract.py
"""
import pytest
import torch

from repro.parallel.draft_interface import (
    EMBED_TAP,
    DraftBatch,
    TapDraft,
    TargetFeatures,
    check_tap_layers,
    features_from_hidden_states,
)
from repro.parallel.eagle_draft import TinyEagleDraft
from repro.parallel.harness import PPConfig
from repro.parallel.model import build_policy, build_stages, split_layers, stage_of_tap, tiny_qwen3_config

pytestmark = pytest.mark.timeout(120)


def test_split_layers():
    assert split_layers(8, 4) == [range(2), range(2, 4), range(4, 6), range(6, 8)]
    assert split_layers(10, 3, first=2, last=2) == [range(2), range(2, 8), range(8, 10)]
    assert split_layers(7, 3) == [range(3), range(3, 5), range(5, 7)]
    with pytest.raises(ValueError, match="cannot fill"):
        split_layers(3, 4)
    assert stage_of_tap(EMBED_TAP, split_layers(8, 4)) == 0 and stage_of_tap(5, split_layers(8, 4)) == 2


def test_stages_equal_unsplit_model_and_taps_follow_output_convention():
    cfg = tiny_qwen3_config()
    policy = build_policy(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    with torch.no_grad():
        out = policy(ids, output_hidden_states=True)
        captured = {}
        stages = build_stages(policy, 4)
        stages[0].embed_tokens.register_forward_hook(lambda m, i, o: captured.__setitem__(-1, o))
        stages[1].layers["3"].register_forward_hook(lambda m, i, o: captured.__setitem__(3, o))
        h = ids
        for st in stages:
            h = st(h)
    assert torch.equal(h, out.logits)
    feats = features_from_hidden_states(out.hidden_states, (EMBED_TAP, 3))
    assert torch.equal(feats.hidden[3], captured[3]) and torch.equal(feats.embeds, captured[-1])


def test_draft_contract():
    cfg = tiny_qwen3_config()
    draft = TinyEagleDraft(cfg)
    assert isinstance(draft, TapDraft)
    assert draft.tap_layers == (-1, 1, 3, 4)  # EAGLE-3's [1, L/2-1, L-4] for L=8, plus the embedding
    assert check_tap_layers((1, 17, 32), 36) == (1, 17, 32)
    with pytest.raises(ValueError, match=r"tap_layers \[36\] out of range"):
        check_tap_layers((1, 36), 36)
    with pytest.raises(ValueError, match="detached"):
        TargetFeatures({1: torch.ones(1, 4, 8, requires_grad=True)})
    feats = TargetFeatures({t: torch.randn(1, 8, cfg.hidden_size) for t in draft.tap_layers})
    batch = DraftBatch(torch.randint(0, cfg.vocab_size, (1, 8)), torch.ones(1, 8),
                       torch.randn(1, 8, cfg.vocab_size))
    loss = draft.draft_loss(feats, batch)
    loss.backward()
    assert loss.dim() == 0 and draft.fc.weight.grad is not None
    with pytest.raises(KeyError, match=r"taps \[9\] were not shipped"):
        feats.concat([9])


def test_config_validation():
    with pytest.raises(ValueError, match="schedule 'gpipe'"):
        PPConfig(schedule="gpipe")
    with pytest.raises(ValueError, match="pp=1"):
        PPConfig(pp=1)
    assert PPConfig(pp=4, schedule="zbv").stage_to_rank() == {0: 0, 1: 1, 2: 2, 3: 3, 4: 3, 5: 2, 6: 1, 7: 0}
    assert PPConfig(pp=2, schedule="interleaved1f1b").stage_to_rank() == {0: 0, 1: 1, 2: 0, 3: 1}
