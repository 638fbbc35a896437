"""Loading a released EAGLE-3 checkpoint (vLLM / SpecForge layout) into our draft: the inverse of the export.

A perturbed draft with unsorted taps and a reduced vocabulary is exported with
integrations.vllm.export.export_eagle3 and loaded into a differently initialised draft of the same
shape: every parameter and buffer must come back exactly, and a checkpoint of another shape is refused
naming the field.

    .venv/bin/python -m pytest -q tests/integrations/vllm/test_load.py
"""
import json

import pytest
import torch

from integrations.vllm.export import export_eagle3
from integrations.vllm.load import load_eagle3_checkpoint
from repro.models.eagle3 import Eagle3Config, Eagle3Draft
from repro.models.policy import build_policy
from repro.models.taps import TapSpec
from repro.models.vocab import build_draft_vocab

pytestmark = pytest.mark.timeout(120)


def _draft(policy, taps, draft_vocab, seed):
    counts = torch.rand(policy.vocab_size, generator=torch.Generator().manual_seed(seed))
    d2t, t2d = build_draft_vocab(counts, draft_vocab)
    torch.manual_seed(seed)
    d = Eagle3Draft(Eagle3Config.from_policy(policy, tap_spec=taps, draft_vocab_size=draft_vocab), d2t, t2d)
    d.init_from_policy(policy)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return d.eval()


@pytest.fixture(scope="module")
def policy():
    return build_policy("qwen3", "tiny", seed=0)


@pytest.mark.parametrize("prefix", ["midlayer.", "layers.0."])
def test_export_then_import_restores_every_weight(tmp_path, policy, prefix):
    taps = TapSpec((3, 0, 1), "output", policy.num_layers)     # unsorted: fc's blocks must be put back
    src = _draft(policy, taps, draft_vocab=40, seed=3)
    path = export_eagle3(src, tmp_path / "ckpt")
    if prefix != "midlayer.":                                 # SpecForge-style names
        from safetensors.torch import load_file, save_file
        t = load_file(str(path / "model.safetensors"))
        save_file({k.replace("midlayer.", prefix): v for k, v in t.items()}, str(path / "model.safetensors"))
    dst = _draft(policy, taps, draft_vocab=40, seed=7)
    assert any(not torch.equal(a, b) for a, b in zip(src.state_dict().values(), dst.state_dict().values()))
    load_eagle3_checkpoint(dst, path)
    for (k, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        assert torch.equal(a, b), f"{k} differs after export + import"


def test_a_checkpoint_of_another_shape_is_refused_naming_the_field(tmp_path, policy):
    src = _draft(policy, TapSpec((0, 1, 3), "output", policy.num_layers), draft_vocab=40, seed=3)
    path = export_eagle3(src, tmp_path / "ckpt")
    other_taps = _draft(policy, TapSpec((0, 2, 3), "output", policy.num_layers), draft_vocab=40, seed=3)
    with pytest.raises(ValueError, match="eagle_aux_hidden_state_layer_ids"):
        load_eagle3_checkpoint(other_taps, path)
    other_vocab = _draft(policy, TapSpec((0, 1, 3), "output", policy.num_layers), draft_vocab=32, seed=3)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        load_eagle3_checkpoint(other_vocab, path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_eagle3_checkpoint(src, path)
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_eagle3_checkpoint(src, path)


def test_t2d_follows_from_d2t_when_the_checkpoint_has_none(tmp_path, policy):
    from safetensors.torch import load_file, save_file
    taps = TapSpec((0, 1, 3), "output", policy.num_layers)
    src = _draft(policy, taps, draft_vocab=40, seed=3)
    path = export_eagle3(src, tmp_path / "ckpt")
    t = load_file(str(path / "model.safetensors"))
    del t["t2d"]
    save_file(t, str(path / "model.safetensors"))
    dst = _draft(policy, taps, draft_vocab=40, seed=7)
    load_eagle3_checkpoint(dst, path)
    assert torch.equal(dst.t2d, src.t2d) and torch.equal(dst.d2t, src.d2t)
