"""Policy construction and taps: both tap-index conventions, pinned per draft family, against HF hidden_states.

    .venv/bin/python -m pytest -q tests/models/test_policy_taps.py
"""
import pytest
import torch

from repro.models.policy import FAMILIES, build_policy, load_policy, policy_config
from repro.models.taps import TapSpec


@pytest.mark.timeout(60)
@pytest.mark.parametrize("family", FAMILIES)
def test_hooked_taps_equal_hf_hidden_states(family):
    out_spec = TapSpec((1, 3, 4), "output", 8)
    in_spec = TapSpec((2, 4, 5), "input", 8)        # the same three tensors, named as vLLM/EAGLE do
    assert in_spec.as_output_layers() == out_spec.layers and out_spec.as_input_layers() == in_spec.layers
    pol = build_policy(family, "tiny", seed=2, tap_spec=out_spec)
    x = torch.randint(0, pol.vocab_size, (2, 11))
    got_out = pol.forward_train(x).taps
    pol.set_taps(in_spec)
    got_in = pol.forward_train(x).taps
    with torch.no_grad():
        hs = pol.model(x, output_hidden_states=True).hidden_states      # [emb, out_0, ..., norm(out_7)]
    assert len(hs) == 9
    for t_out, t_in, idx in zip(got_out, got_in, out_spec.hf_hidden_state_indices()):
        torch.testing.assert_close(t_out, hs[idx], rtol=0, atol=0)
        torch.testing.assert_close(t_in, hs[idx], rtol=0, atol=0)
        assert not t_out.requires_grad
    # input of layer 0 is the embedding output
    pol.set_taps(TapSpec((0,), "input", 8))
    torch.testing.assert_close(pol.forward_train(x).taps[0], hs[0], rtol=0, atol=0)


def test_family_tap_conventions_are_pinned():
    # EAGLE-3: "2, N/2, N-3" in the input convention (original EAGLE, vLLM) == [1, N//2-1, N-4] output
    e = TapSpec.eagle3_default(36)
    assert e.convention == "output" and e.layers == (1, 17, 32)
    assert e.as_input_layers() == (2, 18, 33)
    assert TapSpec.eagle3_default(8).layers == (1, 3, 4)
    # DFlash/DSpark: evenly from 1 to N-3, output convention (hidden_states[id + 1])
    d = TapSpec.dflash_default(36, 5)
    assert d.convention == "output" and d.layers == (1, 9, 17, 25, 33)
    assert d.hf_hidden_state_indices() == (2, 10, 18, 26, 34)
    assert TapSpec.dflash_default(8, 2).layers == (1, 5) and TapSpec.dflash_default(8, 3).layers == (1, 3, 5)
    assert TapSpec.dflash_default(8, 1).layers == (4,)


def test_bad_taps_raise():
    with pytest.raises(ValueError, match=r"tap layer 8 \(output convention\) is out of range.*8 decoder layers"):
        TapSpec((1, 8), "output", 8)
    with pytest.raises(ValueError, match="tap convention 'middle'"):
        TapSpec((1,), "middle", 8)
    with pytest.raises(ValueError, match="repeat"):
        TapSpec((1, 1), "output", 8)
    pol = build_policy("qwen3", "tiny")
    with pytest.raises(ValueError, match="TapSpec is for a 36-layer policy, this one has 8"):
        pol.set_taps(TapSpec.eagle3_default(36))


def test_configs_and_missing_checkpoint(tmp_path):
    cfg = policy_config("qwen3", "gpu")
    assert cfg.hidden_size == 1024 and cfg.num_hidden_layers == 24
    with pytest.raises(ValueError, match="policy family 'mamba'"):
        policy_config("mamba", "tiny")
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "Qwen3-8B")):
        load_policy(tmp_path / "Qwen3-8B")


@pytest.mark.timeout(60)
def test_load_policy_from_a_local_checkpoint(tmp_path):
    pol = build_policy("qwen3", "tiny", seed=9)
    pol.model.save_pretrained(tmp_path / "ckpt")
    loaded = load_policy(tmp_path / "ckpt", dtype=torch.float32, tap_spec=TapSpec.eagle3_default(8))
    assert loaded.family == "qwen3" and loaded.tap_spec.layers == (1, 3, 4)
    x = torch.randint(0, 128, (1, 9))
    torch.testing.assert_close(loaded.forward_train(x).logits, pol.forward_train(x, want_taps=False).logits,
                               rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["qwen3", "gpt_oss"])
def test_right_padded_forward_equals_per_row(family):
    pol = build_policy(family, "tiny", seed=4, dtype=torch.float64, tap_spec=TapSpec((1, 5), "output", 8))
    a, b = torch.randint(0, 128, (7,)), torch.randint(0, 128, (20,))     # 20 > GPT-OSS window 16
    ids = torch.zeros(2, 20, dtype=torch.long)
    ids[0, :7], ids[1] = a, b
    mask = torch.zeros(2, 20, dtype=torch.long)
    mask[0, :7], mask[1] = 1, 1
    out = pol.forward_train(ids, attention_mask=mask)
    for r, x in enumerate((a, b)):
        ref = pol.forward_train(x[None])
        n = x.numel()
        torch.testing.assert_close(out.logits[r, :n], ref.logits[0], rtol=0, atol=1e-10)
        for t, rt in zip(out.taps, ref.taps):
            torch.testing.assert_close(t[r, :n], rt[0], rtol=0, atol=1e-10)
