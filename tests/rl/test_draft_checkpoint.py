"""A profile's EAGLE-3 draft spec naming a released checkpoint: the run's draft starts from its weights.

A draft checkpoint is written by hand in the released (SpecForge / vLLM) naming that
integrations.vllm.load reads (``fc``, ``layers.0.*``, ``norm``, ``lm_head``, ``d2t``/``t2d`` and a
config.json with ``draft_vocab_size``, ``target_hidden_size`` and the taps as
``eagle_aux_hidden_state_layer_ids``) for the tiny Qwen3 checkpoint of test_paper_profile_suite. The
profile copy's ``rl.drafts.eagle3.checkpoint`` names it (resolved under checkpoint_root like a policy's
checkpoint). Checked: a run's trainer and rollout drafts hold exactly the saved weights, and a step
trains from them; a checkpoint that does not fit the policy, a tensor of the wrong shape, a missing
folder or weights file fail with a ConfigError naming the checkpoint (the missing ones before any model
is built); the config keeps older configs equal.

    .venv/bin/python -m pytest -q tests/rl/test_draft_checkpoint.py
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from repro.core.specs import ConfigError, DraftSpec
from repro.rl import run
from repro.rl.config import RunConfig, run_config_from_profile
from repro.rl.drafts import build_draft

from .test_paper_profile_suite import _no_models, ckpt_root, profile_file  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(60)
DRAFT_DIR = "hand-written-eagle3"
DRAFT_VOCAB = 200           # a reduced draft vocabulary: the d2t/t2d maps must come from the checkpoint
TAPS_INPUT = [2, 4, 5]      # vLLM's input-of-layer ids of the EAGLE-3 default taps (output 1, 3, 4) of 8 layers
LAYER = ("input_layernorm", "hidden_norm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
         "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def released_tensors(hidden=32, heads=2, kv_heads=1, head_dim=16, mlp=64, target_hidden=32, vocab=320):
    """Random weights under the released names, with the shapes of an EAGLE-3 draft of the tiny policy."""
    g = torch.Generator().manual_seed(11)
    shapes = {"input_layernorm": (hidden,), "hidden_norm": (hidden,), "post_attention_layernorm": (hidden,),
              "self_attn.q_proj": (heads * head_dim, 2 * hidden), "self_attn.k_proj": (kv_heads * head_dim, 2 * hidden),
              "self_attn.v_proj": (kv_heads * head_dim, 2 * hidden), "self_attn.o_proj": (hidden, heads * head_dim),
              "mlp.gate_proj": (mlp, hidden), "mlp.up_proj": (mlp, hidden), "mlp.down_proj": (hidden, mlp)}
    t = {f"layers.0.{k}.weight": torch.randn(s, generator=g) for k, s in shapes.items()}
    t["fc.weight"] = torch.randn(hidden, len(TAPS_INPUT) * target_hidden, generator=g)
    t["norm.weight"] = torch.randn(hidden, generator=g)
    t["lm_head.weight"] = torch.randn(DRAFT_VOCAB, hidden, generator=g)
    target_ids = torch.randperm(vocab, generator=g)[:DRAFT_VOCAB].sort().values
    t["d2t"] = target_ids - torch.arange(DRAFT_VOCAB)          # offsets: target id = draft id + d2t
    t["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, target_ids, True)
    return t


def write_checkpoint(folder: Path, tensors: dict, **config) -> Path:
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 32,
           "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
           "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "vocab_size": 320,
           "draft_vocab_size": DRAFT_VOCAB, "target_hidden_size": 32,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": TAPS_INPUT, "use_aux_hidden_state": True}}
    (folder / "config.json").write_text(json.dumps({**cfg, **config}))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


@pytest.fixture()
def draft_profile(ckpt_root, profile_file, tmp_path):  # noqa: F811 (fixtures imported above)
    """The tiny paper-h100 copy whose rl.drafts.eagle3 names a hand-written checkpoint under ckpt_root."""
    prof = yaml.safe_load(profile_file.read_text())
    prof["checkpoints"]["qwen3-8b-eagle3"] = DRAFT_DIR
    assert prof["rl"]["drafts"]["eagle3"]["checkpoint"] == "qwen3-8b-eagle3"   # as paper-h100 names it
    path = tmp_path / "paper-h100.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    write_checkpoint(ckpt_root / DRAFT_DIR, released_tensors())
    return prof, path


def _cfg(prof, ckpt_root, out="o"):  # noqa: F811
    return run_config_from_profile(prof, "table1", "Qwen3-8B/EAGLE-3", out=str(out), checkpoint_root=ckpt_root)


def test_run_starts_from_the_checkpoint_weights(draft_profile, ckpt_root, tmp_path):  # noqa: F811
    from repro.rl.hf_tokenizer import tokenizer_for_run
    from repro.rl.trainer import CoTrainer
    prof, _ = draft_profile
    cfg = _cfg(prof, ckpt_root, tmp_path / "run")
    assert cfg.draft.checkpoint == "qwen3-8b-eagle3" and cfg.draft.path == str(ckpt_root.resolve() / DRAFT_DIR)
    trainer = CoTrainer(cfg, tokenizer_for_run(cfg, out=cfg.out, seed=0))
    saved = released_tensors()
    for draft in (trainer.draft, trainer.rollout_draft):
        own = draft.state_dict()
        assert draft.tap_layers == (1, 3, 4) and draft.cfg.draft_vocab_size == DRAFT_VOCAB
        assert draft.cfg.ttt_steps == cfg.draft.options["ttt_steps"]          # the profile's TTT option kept
        assert torch.equal(own["fc.weight"], saved["fc.weight"])               # taps ascending: blocks in place
        for name in LAYER:
            ours = f"{name.split('.')[-1]}.weight" if name.startswith("self_attn") else f"{name}.weight"
            assert torch.equal(own[ours], saved[f"layers.0.{name}.weight"]), name
        for name in ("norm.weight", "lm_head.weight", "d2t", "t2d"):
            assert torch.equal(own[name], saved[name].to(own[name].dtype)), name
        # no embed_tokens in the checkpoint: the draft keeps the policy's
        assert torch.equal(own["embed_tokens.weight"], trainer.policy.embed_tokens.weight)
    m, _, _ = trainer.train_step(0)                 # the warm draft proposes and trains
    assert m["train/acceptance_length"] >= 1 and m["train/draft_loss"] > 0
    assert not torch.equal(trainer.draft.state_dict()["fc.weight"], saved["fc.weight"])


@pytest.mark.parametrize("case,match", [
    ("target_hidden", r"target_hidden_size is 48, but the policy's hidden size is 32"),
    ("tensor_shape", r"q_proj.weight shape is \(16, 64\), but the draft was built with \(32, 64\)"),
    ("taps", r"tap layer 8 \(output convention\) is out of range"),
])
def test_a_checkpoint_that_does_not_fit_is_refused(draft_profile, ckpt_root, case, match):  # noqa: F811
    from repro.rl.warmstart import make_policy
    prof, _ = draft_profile
    folder, tensors = ckpt_root / DRAFT_DIR, released_tensors()
    if case == "target_hidden":
        tensors["fc.weight"] = torch.zeros(32, 3 * 48)
        write_checkpoint(folder, tensors, target_hidden_size=48)
    elif case == "tensor_shape":
        tensors["layers.0.self_attn.q_proj.weight"] = torch.zeros(16, 64)
        write_checkpoint(folder, tensors)
    else:
        write_checkpoint(folder, tensors, eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 9]})
    cfg = _cfg(prof, ckpt_root)
    policy = make_policy(cfg.policy, cfg.vocab_size, seed=0, dtype=torch.float32, device="cpu")
    with pytest.raises(ConfigError, match=r"draft.checkpoint='qwen3-8b-eagle3' .*cannot be loaded.*" + match):
        build_draft(cfg.draft, policy, mask_token_id=0, train=True)


def test_missing_folder_or_weights_fail_before_any_model(draft_profile, ckpt_root, tmp_path, monkeypatch,  # noqa: F811
                                                         capsys):
    _no_models(monkeypatch)
    _, path = draft_profile
    folder = ckpt_root / DRAFT_DIR
    (folder / "model.safetensors").unlink()
    args = ["--artifact", "table1", "--row", "Qwen3-8B/EAGLE-3", "--profile", str(path), "--engine", "suite",
            "--checkpoint-root", str(ckpt_root), "--out", str(tmp_path / "r")]
    assert run.main(args) == 2
    err = capsys.readouterr().err
    assert "draft.checkpoint='qwen3-8b-eagle3'" in err and str(folder.resolve()) in err and "no *.safetensors" in err
    (folder / "config.json").unlink()
    folder.rmdir()
    assert run.main(args) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "--checkpoint-root" in err
    assert not (tmp_path / "r").exists()


def test_checkpoint_key_family_and_config_round_trip(draft_profile, ckpt_root):  # noqa: F811
    prof, _ = draft_profile
    cfg = _cfg(prof, ckpt_root)
    d = cfg.to_dict()
    assert d["draft"]["checkpoint"] == "qwen3-8b-eagle3" and RunConfig.from_dict(d).validate().draft == cfg.draft
    assert "checkpoint" not in RunConfig(artifact="table1", row="r", profile="p", out="o",
                                         draft=DraftSpec()).to_dict()["draft"]     # older configs unchanged
    prof["rl"]["drafts"]["eagle3"]["checkpoint"] = "no-such-key"
    with pytest.raises(ConfigError, match=r"rl.drafts.eagle3.checkpoint='no-such-key' is invalid: expected one of"):
        _cfg(prof, ckpt_root)
    prof["rl"]["drafts"]["eagle3"]["checkpoint"] = "qwen3-8b-eagle3"
    prof["rl"]["drafts"]["dflash"]["checkpoint"] = "qwen3-8b-dflash"
    with pytest.raises(ConfigError, match=r"no checkpoint for family 'dflash'"):
        run_config_from_profile(prof, "table1", "Qwen3-8B/DFlash", out="o", checkpoint_root=ckpt_root)
    prof["rl"]["drafts"]["dflash"].pop("checkpoint")
    with pytest.raises(ConfigError, match=r"checkpoint_root is not set"):
        prof["rl"]["policies"]["Qwen3-8B"].pop("checkpoint")          # a random-init policy, no root
        prof["rl"]["policies"]["Qwen3-8B"].pop("tokens")
        prof["rl"]["policies"]["Qwen3-8B"]["overrides"] = {"num_hidden_layers": 8}
        run_config_from_profile(prof, "table1", "Qwen3-8B/EAGLE-3", out="o")
