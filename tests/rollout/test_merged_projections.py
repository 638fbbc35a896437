"""Merged q/k/v and gate/up projections for decoding (repro.decoding.merged_projections), CPU only.

Inside the block a decode step gives the logits of the unmerged model (fp32, to rounding); the parameters become
rows of the stacks (no second copy), so in-place weight changes reach them, and parameters given new storage are
stacked again; the gated MLPs take one class for every layer (gate, up and the gate in one call); calls on another
input fall back; MoE layers merge only their attention; outside the block the model's modules are their own again
(classes, buffers, state dict values).

    .venv/bin/python -m pytest -q tests/rollout/test_merged_projections.py
"""
import pytest
import torch
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP

from repro.decoding.merged_projections import (
    STASH,
    MergedFirst,
    MergedPart,
    MergedProjections,
    gated_class,
    merged_projections,
)
from repro.models.policy import build_policy

from .helpers import step_logits


@pytest.mark.timeout(60)
def test_decode_step_equals_the_unmerged_model_and_the_model_is_restored():
    pol = build_policy("qwen3", "tiny", seed=1, init_std=0.2)
    ids = torch.randint(0, 127, (3, 7), generator=torch.Generator().manual_seed(0))
    before = {k: v.clone() for k, v in pol.model.state_dict().items()}
    want = step_logits(pol, ids)
    with merged_projections(pol.model):
        attn = pol.decoder_layers()[0].self_attn
        assert type(attn.q_proj) is MergedFirst and type(attn.v_proj) is MergedPart
        assert attn.q_proj.merged_weight.shape == (attn.q_proj.out_features + 2 * attn.k_proj.out_features,
                                                   attn.q_proj.in_features)
        mlp_cls = type(pol.decoder_layers()[0].mlp)
        assert mlp_cls is gated_class(Qwen3MLP) and all(type(la.mlp) is mlp_cls for la in pol.decoder_layers())
        got = step_logits(pol, ids)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert STASH.x is None and STASH.y is None
    for layer in pol.decoder_layers():
        assert type(layer.mlp) is Qwen3MLP
        for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.mlp.up_proj):
            assert type(m) is nn.Linear and "merged_weight" not in m._buffers and "merged_start" not in vars(m)
    after = pol.model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


@pytest.mark.timeout(60)
def test_stacked_weights_follow_in_place_changes():
    pol = build_policy("qwen3", "tiny", seed=2, init_std=0.2)
    ids = torch.randint(0, 127, (2, 5), generator=torch.Generator().manual_seed(1))
    mp = MergedProjections(pol.model)
    with mp.active():
        step_logits(pol, ids)
    stacked = mp.groups[0].weight
    ptr = stacked.data_ptr()
    with torch.no_grad():                       # a weight push: copy_ into the existing parameters
        for p in pol.model.parameters():
            p.copy_(p * 1.5)
    want = step_logits(pol, ids)
    with mp.active():
        got = step_logits(pol, ids)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert mp.groups[0].weight.data_ptr() == ptr          # the same stack: graphs over it stay valid
    q, k, v = mp.groups[0].members
    torch.testing.assert_close(stacked, torch.cat([q.weight, k.weight, v.weight]))
    # no second copy: the parameters are the stack's rows
    assert q.weight.data_ptr() == ptr and v.weight.data_ptr() == stacked[-v.out_features:].data_ptr()
    pol.model.to(torch.float64)                           # new storage for every parameter: stacked again
    want = step_logits(pol, ids)
    with mp.active():
        got = step_logits(pol, ids)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    assert mp.groups[0].weight.dtype == torch.float64 and q.weight.data_ptr() == mp.groups[0].weight.data_ptr()


@pytest.mark.timeout(60)
def test_another_input_falls_back_and_nested_blocks_keep_the_merge():
    pol = build_policy("qwen3", "tiny", seed=3)
    attn = pol.decoder_layers()[1].self_attn
    x, other = torch.randn(2, 3, attn.q_proj.in_features), torch.randn(2, 3, attn.q_proj.in_features)
    with merged_projections(pol.model), torch.no_grad():
        with merged_projections(pol.model):
            pass
        assert type(attn.q_proj) is MergedFirst              # the inner exit left the outer block merged
        q = attn.q_proj(x)
        torch.testing.assert_close(q, nn.functional.linear(x, attn.q_proj.weight))
        torch.testing.assert_close(attn.k_proj(other), nn.functional.linear(other, attn.k_proj.weight))
        torch.testing.assert_close(attn.k_proj(x), nn.functional.linear(x, attn.k_proj.weight))


@pytest.mark.timeout(60)
def test_moe_layers_merge_their_attention_only():
    pol = build_policy("qwen3_moe", "tiny", seed=4, init_std=0.2)
    mp = MergedProjections(pol.model)
    assert len(mp.groups) == pol.num_layers                   # the experts' block has no gate_proj/up_proj pair
    assert not mp.gated                                       # so no gated MLP either
    ids = torch.randint(0, 127, (2, 6), generator=torch.Generator().manual_seed(2))
    want = step_logits(pol, ids)
    with mp.active():
        got = step_logits(pol, ids)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
