"""Paper profiles on the suite's own engine (``--engine suite``): checkpoint policies and their tokenizer.

A tiny Qwen3 checkpoint (random weights, ``save_pretrained``) and a small byte-level BPE tokenizer with
Qwen3's special-token names are written to ``tmp_path``; a copy of paper-h100's profile points its
``qwen3-8b`` checkpoint there, with tiny GRPO sizes. Checked: a missing checkpoint fails naming the key,
the path and how to set checkpoint_root before any model is built; the tokenizer adapter's role ids
and errors; a DFlash row runs 2 steps through ``repro.rl.run`` and an EAGLE-3 row through torchrun
at PP=2 (its draft warm-started from a tiny released-layout EAGLE-3 checkpoint); without ``--engine
suite`` the nemo-rl profile is still refused.

    .venv/bin/python -m pytest -q tests/rl/test_paper_profile_suite.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from repro.core.profile import PROFILE_DIR
from repro.core.specs import ConfigError
from repro.rl import dist_run, run
from repro.rl.config import RunConfig, run_config_from_profile
from repro.rl.config import main as config_main
from repro.rl.hf_tokenizer import CheckpointTokenizer, tokenizer_for_run

ROOT = Path(__file__).resolve().parents[2]
QWEN3_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "<tool_call>", "</tool_call>",
                 "<tool_response>", "</tool_response>", "<|mask|>"]
VOCAB = 320          # embedding rows; the tokenizer has fewer tokens (as Qwen3's 151,936 vs 151,669)
CKPT_DIR = "tiny-qwen3"
EAGLE3_DIR = "tiny-qwen3-eagle3"     # a released-layout EAGLE-3 draft of the tiny policy (rl.drafts.eagle3)


def _save_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from repro.rl.tokenizer import workload_corpus
    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=QWEN3_SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(workload_corpus(0, n_math=60, n_tools=20), trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 mask_token="<|mask|>")
    hf.save_pretrained(folder)


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory) -> Path:
    import torch
    from transformers import Qwen3ForCausalLM

    from repro.models.policy import policy_config
    root = tmp_path_factory.mktemp("ckpts")
    cfg = policy_config("qwen3", "tiny", vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=8, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(root / CKPT_DIR)
    _save_tokenizer(root / CKPT_DIR)
    _save_eagle3(root / CKPT_DIR, root / EAGLE3_DIR)
    return root


def _save_eagle3(policy_dir: Path, out: Path) -> None:
    """An EAGLE-3 draft of the policy at ``policy_dir`` (default taps, full vocabulary), in vLLM's layout."""
    import torch
    from transformers import AutoModelForCausalLM

    from integrations.vllm.export import export_eagle3
    from repro.models.eagle3 import Eagle3Config, Eagle3Draft
    from repro.models.policy import Policy
    policy = Policy(AutoModelForCausalLM.from_pretrained(policy_dir, local_files_only=True), family="qwen3")
    torch.manual_seed(1)
    draft = Eagle3Draft(Eagle3Config.from_policy(policy))
    draft.init_from_policy(policy)
    export_eagle3(draft, out)


@pytest.fixture()
def profile_file(tmp_path) -> Path:
    """paper-h100 with its qwen3-8b checkpoint at the tiny one, on CPU in fp32, tiny GRPO sizes and drafts."""
    prof = yaml.safe_load((PROFILE_DIR / "paper-h100.yaml").read_text())
    prof["checkpoints"]["qwen3-8b"] = CKPT_DIR
    prof["checkpoints"]["qwen3-8b-eagle3"] = EAGLE3_DIR
    prof["hardware"].update(device="cpu", gpus=0)
    prof["dtype"] = "float32"
    rl = prof["rl"]
    pol = rl["policies"]["Qwen3-8B"]
    pol["tokens"] = {k: v for k, v in pol["tokens"].items() if k != "mask"}   # the tokenizer's own <|mask|>
    pol["mesh"] = {"pp": 2, "cp": 1}
    rl["grpo"].update(prompts_per_step=2, generations_per_prompt=2, max_new_tokens=8, microbatch=2, lr=1e-3)
    rl["workload"].update(val_every=100, val_size=2)
    rl["drafts"]["eagle3"]["options"] = {"ttt_steps": 2}
    rl["drafts"]["eagle3"]["num_proposals"] = 2
    rl["drafts"]["dflash"].update(num_proposals=3,
                                  options={"block_size": 4, "num_anchors": 4, "num_layers": 1})
    prof["table1"]["steps"] = 2
    path = tmp_path / "paper-h100.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return path


def _no_models(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a model was built before the checkpoint was validated")
    import transformers
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    monkeypatch.setattr(run, "CoTrainer", boom)


@pytest.mark.timeout(60)
def test_missing_checkpoint_fails_before_any_model_naming_key_and_path(tmp_path, profile_file, monkeypatch,
                                                                        capsys):
    _no_models(monkeypatch)
    base = ["--artifact", "table1", "--row", "Qwen3-8B/DFlash", "--profile", str(profile_file),
            "--engine", "suite"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run.main(base + ["--checkpoint-root", str(empty), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "'qwen3-8b'" in err and str(empty / CKPT_DIR) in err and "does not exist" in err
    assert "--checkpoint-root" in err and "checkpoint_root=" in err
    (empty / CKPT_DIR).mkdir()                                   # a folder without config.json
    assert run.main(base + ["--checkpoint-root", str(empty), "--out", str(tmp_path / "r")]) == 2
    assert "has no config.json" in capsys.readouterr().err
    assert run.main(base + ["--out", str(tmp_path / "r")]) == 2  # no root at all
    err = capsys.readouterr().err
    assert "checkpoint_root is not set" in err and "--checkpoint-root" in err
    monkeypatch.setenv("WORLD_SIZE", "2")                        # dist_run: the same check, no process group
    assert dist_run.main(base + ["--checkpoint-root", str(empty), "--out", str(tmp_path / "d")]) == 2
    assert "has no config.json" in capsys.readouterr().err
    assert not (tmp_path / "r").exists() and not (tmp_path / "d").exists()


def test_nemo_rl_profile_still_refused_without_engine_suite(tmp_path, capsys, monkeypatch):
    _no_models(monkeypatch)
    args = ["--artifact", "table1", "--row", "Qwen3-8B/DFlash", "--profile", "paper-h100",
            "--out", str(tmp_path / "r")]
    assert run.main(args) == 2
    err = capsys.readouterr().err
    assert "NeMo-RL" in err and "--engine suite" in err
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert dist_run.main(args) == 2
    err = capsys.readouterr().err
    assert "NeMo-RL" in err and "--engine suite" in err


def test_config_resolves_checkpoint_vocab_and_keeps_old_configs(ckpt_root, profile_file, capsys):
    prof = yaml.safe_load(profile_file.read_text())
    cfg = run_config_from_profile(prof, "table1", "Qwen3-8B/DFlash", out="o", checkpoint_root=ckpt_root)
    assert cfg.policy.path == str(ckpt_root.resolve() / CKPT_DIR) and cfg.vocab_size == VOCAB
    assert cfg.grpo.max_new_tokens == 8 and cfg.draft.options["block_size"] == 4
    d = cfg.to_dict()
    assert d["policy"]["checkpoint"] == "qwen3-8b" and RunConfig.from_dict(d).validate().policy == cfg.policy
    assert "checkpoint" not in RunConfig(artifact="table1", row="r", profile="p", out="o").to_dict()["policy"]
    config_main(["--profile", str(profile_file), "--artifact", "table2", "--checkpoint-root", str(ckpt_root)])
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(printed) == 4 and {p["policy"]["path"] for p in printed} == {cfg.policy.path}
    with pytest.raises(ConfigError, match=r"family='llama' is invalid: expected 'qwen3'"):
        prof["rl"]["policies"]["Qwen3-8B"]["family"] = "llama"
        run_config_from_profile(prof, "table1", "Qwen3-8B/DFlash", out="o", checkpoint_root=ckpt_root)
    with pytest.raises(ConfigError, match=r"warm_start=.*checkpoint policy 'qwen3-8b'"):
        prof["rl"]["policies"]["Qwen3-8B"]["family"] = "qwen3"
        run_config_from_profile(prof, "table1", "Qwen3-8B/DFlash", out="o", checkpoint_root=ckpt_root,
                                warm_start="w")


def test_paper_profile_rows_use_paper_lengths_and_drafts(ckpt_root):
    prof = yaml.safe_load((PROFILE_DIR / "paper-h100.yaml").read_text())
    # only to pass the checkpoint checks; sizes are paper's
    prof["checkpoints"]["qwen3-8b"] = CKPT_DIR
    prof["checkpoints"]["qwen3-8b-eagle3"] = EAGLE3_DIR
    cfg = run_config_from_profile(prof, "table1", "Qwen3-8B/DFlash", out="o", checkpoint_root=ckpt_root)
    assert cfg.grpo.max_new_tokens == 16384 and cfg.draft.options["block_size"] == 16
    assert cfg.draft.num_proposals == 15
    cfg = run_config_from_profile(prof, "fig4", "EAGLE-3", out="o", checkpoint_root=ckpt_root)
    assert cfg.workload.name == "workplace" and cfg.grpo.max_new_tokens == 28672
    assert cfg.draft.options == {"ttt_steps": 3} and cfg.draft.num_proposals == 3
    assert cfg.draft.checkpoint == "qwen3-8b-eagle3"
    assert cfg.draft.path == str(ckpt_root.resolve() / EAGLE3_DIR)


@pytest.mark.parametrize("name", ["paper-h100", "paper-gb200"])
def test_every_paper_row_has_a_suite_config_that_only_lacks_its_checkpoint(name, tmp_path):
    from repro.core.profile import load_profile
    prof = load_profile(name)
    n = 0
    for artifact in ("table1", "table2", "fig3", "fig4"):
        for row in (prof.get(artifact) or {}).get("rows", {}):
            with pytest.raises(ConfigError,
                               match=r"policy.checkpoint='[^']+' is invalid: its folder .* does not exist"):
                run_config_from_profile(prof, artifact, row, out="o", checkpoint_root=tmp_path)
            n += 1
    assert n >= 6


def test_checkpoint_tokenizer_roles_and_errors(ckpt_root, profile_file):
    prof = yaml.safe_load(profile_file.read_text())
    cfg = run_config_from_profile(prof, "table1", "Qwen3-8B/DFlash", out="o", checkpoint_root=ckpt_root)
    tok = tokenizer_for_run(cfg, out="unused", seed=0)
    assert isinstance(tok, CheckpointTokenizer) and tok.vocab_size == VOCAB
    hf = tok.hf
    assert (tok.pad_id, tok.eos_id, tok.mask_id) == tuple(hf.convert_tokens_to_ids(t) for t in
                                                         ("<|endoftext|>", "<|im_end|>", "<|mask|>"))
    assert tok.call_end_id == hf.convert_tokens_to_ids("</tool_call>") and tok.user_id != tok.assistant_id
    text = "What is 12 + 30? The answer is 42."
    assert tok.decode(tok.encode(text)) == text and tok.eos_id not in tok.encode(text)
    # unused rows decode to ""
    assert tok.decode([tok.eos_id, VOCAB - 1], skip_special=False) == "<|im_end|>"
    path = cfg.policy.path
    no_mask = {k: v for k, v in prof["rl"]["policies"]["Qwen3-8B"]["tokens"].items()}
    hf.mask_token = None
    with pytest.raises(ConfigError, match="no mask token, which block drafts"):
        CheckpointTokenizer(hf, VOCAB, no_mask, need_mask=True)
    assert CheckpointTokenizer(hf, VOCAB, no_mask).mask_id is None          # EAGLE-3 / no draft: not needed
    with pytest.raises(ConfigError, match=r"tokens.mask=151669 is invalid: expected an id in \[0, 320\)"):
        CheckpointTokenizer.load(path, {**no_mask, "mask": 151669})
    with pytest.raises(ConfigError, match=r"tokens.user='<\|user\|>' is invalid: .* has no such token"):
        CheckpointTokenizer.load(path, {**no_mask, "user": "<|user|>"})
    with pytest.raises(ConfigError, match="has no call token"):
        CheckpointTokenizer.load(path, {k: v for k, v in no_mask.items() if k != "call"})


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(240)
def test_dflash_row_runs_two_steps_single_process(ckpt_root, profile_file, tmp_path):
    out = tmp_path / "run"
    rc = run.main(["--artifact", "table1", "--row", "Qwen3-8B/DFlash", "--profile", str(profile_file),
                   "--engine", "suite", "--checkpoint-root", str(ckpt_root), "--out", str(out),
                   "--threads", "1"])
    assert rc == 0
    rows = _metrics(out)
    assert [r["step"] for r in rows] == [0, 1] and all(r["row"] == "Qwen3-8B/DFlash" for r in rows)
    for r in rows:
        assert r["train/gen_tokens"] > 0 and r["train/draft_loss"] > 0 and r["train/acceptance_length"] >= 1
        assert r["train/train_inference_kl"] < 1e-5, "trainer and engine disagree on the checkpoint policy"
    cfg = json.loads((out / "env.json").read_text())["config"]
    assert cfg["policy"]["checkpoint"] == "qwen3-8b" and cfg["vocab_size"] == VOCAB
    assert json.loads((out / "run.json").read_text())["steps"] == 2
    assert not (out / "tokenizer").exists(), "a checkpoint run uses the checkpoint's tokenizer, trains none"


@pytest.mark.timeout(240)
def test_eagle3_row_runs_through_torchrun_pp2_with_mesh_suggestion(ckpt_root, profile_file, tmp_path):
    out = tmp_path / "dist"
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "repro.rl.dist_run", "--artifact", "table1", "--row", "Qwen3-8B/EAGLE-3",
           "--profile", str(profile_file), "--engine", "suite", "--checkpoint-root", str(ckpt_root),
           "--threads", "1", "--out", str(out)]       # no --pp/--cp: the policy's mesh {pp: 2, cp: 1}
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = _metrics(out)
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert r["train/draft_loss"] > 0 and r["train/tap_wait_s"] > 0
        assert r["train/train_inference_kl"] < 1e-5, "trainer (PP) and engine disagree on the policy"
    env_json = json.loads((out / "env.json").read_text())
    assert env_json["config"]["parallel"]["pp"] == 2
    assert env_json["config"]["policy"]["checkpoint"] == "qwen3-8b"
    assert env_json["config"]["draft"]["checkpoint"] == "qwen3-8b-eagle3"     # every rank built it warm
