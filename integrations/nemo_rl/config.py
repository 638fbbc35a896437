"""One paper row -> one NeMo-RL GRPO config (YAML), written into the run folder.

The config inherits (``defaults:``, an absolute path) from the NeMo-RL example the row's workload
names in the user's checkout (examples/configs/grpo_math_8B_megatron.yaml for single-turn math,
examples/nemo_gym/grpo_workplace_assistant_*.yaml for the Workplace Assistant) and overrides only
what the paper fixes: model and draft checkpoints, the Megatron TP/PP/CP/EP layout, the draft block
(``policy.draft.*``: family, loss weight, TTT passes, block size, anchors), vLLM's speculative config,
the GRPO batch, sequence lengths (4,096 input + 16,384 response; 32,768 multi-turn), datasets, and
W&B names the suite's collector recognises. A no-draft row is the same config with the draft off.

    python -m integrations.nemo_rl.run --artifact table1 --row Qwen3-8B/DFlash --profile paper-h100 \
        --out results/x --config-only ...     # writes <out>/nemo_rl_config.yaml
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from integrations.nemo_rl.rows import RowSpec
from integrations.nemo_rl.skeleton import merge
from repro.core.io import write_atomic
from repro.core.metrics import DEFAULT_PROJECT
from repro.core.provenance import git_state

CONFIG_NAME = "nemo_rl_config.yaml"
TRIAL_NAME = ".nemo_rl_config.trial.yaml"       # what NeMo-RL's own loader checks before CONFIG_NAME is written
REJECTED_NAME = "nemo_rl_config.rejected.yaml"
LOG_DIR_NAME = "nemo_rl_logs"        # NeMo-RL's logger.log_dir inside the run folder
CHECKPOINT_DIR_NAME = "nemo_rl_checkpoints"


@dataclass(frozen=True)
class Paths:
    """Where the user's things are. Checked by checks.py before anything is launched."""
    nemo_rl_dir: Path | None
    checkpoint_root: Path | None
    hf_home: Path | None = None        # HF cache holding the math datasets (single-turn workload)
    dataset_root: Path | None = None   # folder holding the Workplace Assistant JSONL (multi-turn workload)

    def checkpoint(self, spec: RowSpec, key: str) -> Path:
        if self.checkpoint_root is None:
            raise ValueError("checkpoint_root is not set (--checkpoint-root)")
        return self.checkpoint_root / spec.checkpoints[key]


def speculative_tokens(spec: RowSpec) -> int:
    """Tokens proposed per verify step: EAGLE-3 its chain length; DFlash block_size - 1 (the anchor
    is not proposed); DSpark block_size (every slot proposes, the anchor slot predicts the next token)."""
    fam = spec.family
    if fam is None:
        raise ValueError(f"row {spec.row!r} is a no-draft row; it has no speculative tokens")
    if fam.method == "eagle3":
        return int(fam.settings["num_speculative_tokens"])
    assert spec.block_size is not None
    return spec.block_size - 1 if fam.method == "dflash" else spec.block_size


def draft_block(spec: RowSpec, paths: Paths) -> dict[str, Any]:
    """``policy.draft`` of NeMo-RL's DraftConfig (main + PRs 3699/3712/3713)."""
    if spec.family is None:
        return {"enabled": False}
    fam = spec.family
    block: dict[str, Any] = {"enabled": True, "method": fam.method,
                             "model_name": str(paths.checkpoint(spec, spec.draft_checkpoint))}
    block.update({k: v for k, v in fam.settings.items() if k != "num_speculative_tokens"})
    if fam.method in ("dflash", "dspark"):
        block["gamma"] = speculative_tokens(spec)
    return block


def speculative_config(spec: RowSpec, paths: Paths) -> dict[str, Any]:
    """vLLM's speculative_config, passed through NeMo-RL's policy.generation.vllm_kwargs unchanged."""
    return {"method": spec.family.method, "model": str(paths.checkpoint(spec, spec.draft_checkpoint)),
            "num_speculative_tokens": speculative_tokens(spec), "draft_tensor_parallel_size": 1}


def wandb_names(spec: RowSpec) -> dict[str, Any]:
    """logger.wandb: NeMo-RL passes it to wandb.init. Project, group and tags follow the suite's
    MetricsLogger (artifact:<a>, profile:<p>, git:<sha>) so runs of both engines are found the same
    way; the hardware is known only where NeMo-RL runs (env.json, written there by runtime_env)."""
    suffix = "" if spec.is_paper_layout else f"-{spec.layout_name}"
    return {"project": DEFAULT_PROJECT,
            "name": f"{spec.artifact}-{spec.row}{suffix}".replace("/", "-").replace(" ", "_"),
            "group": spec.artifact, "job_type": spec.artifact,
            "tags": [f"artifact:{spec.artifact}", f"profile:{spec.profile}", f"git:{git_state()['sha'][:10]}",
                     "engine:nemo-rl", f"row:{spec.row}", f"layout:{spec.layout_name}"],
            "config": {"engine": "nemo-rl", "artifact": spec.artifact, "profile": spec.profile, "row": spec.row,
                       "layout": spec.layout_name}}


def layout_note(spec: RowSpec) -> str:
    lay = spec.layout
    packed = "packed" if spec.sequence_packing else "unpacked"
    text = f"TP/PP/CP/EP = {lay.tp}/{lay.pp}/{lay.cp}/{lay.ep}, {packed} sequences"
    if spec.is_paper_layout:
        return f"the paper's layout ({text})"
    return (f"layout {spec.layout_name} ({text}): NOT the paper's layout, the one NeMo-RL's co-training "
            "stack (PR 3713 head) runs today; its results do not reproduce the paper's rows")


def _workload(spec: RowSpec, paths: Paths) -> tuple[int, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(max total sequence length, data, env, generation overrides) of the row's workload."""
    w = spec.workload.settings
    if "train_file" in w:
        if paths.dataset_root is None:
            raise ValueError(f"workload {spec.workload.name!r} reads local JSONL: "
                             "dataset_root is not set (--dataset-root)")
        root = paths.dataset_root
        total = int(w["max_total_tokens"])
        data = {"train": {"data_path": str(root / w["train_file"])},
                "validation": {"data_path": str(root / w["validation_file"])}}
        gen = {"vllm_cfg": {"http_server_serving_chat_kwargs": {"enable_auto_tools": True,
                                                                "tool_parser": w["tool_parser"]}}}
        return total, data, {}, gen
    total = int(w["max_input_tokens"]) + int(w["max_response_tokens"])
    data = {"max_input_seq_length": int(w["max_input_tokens"]),
            "train": {"dataset_name": w["train_dataset"]},
            "validation": {"dataset_name": w["validation_dataset"]},
            "default": {"prompt_file": None}}
    env = {"math": {"math_verify_impl": w["math_verify_impl"]}}
    gen = {"max_new_tokens": int(w["max_response_tokens"])}
    return total, data, env, gen


def build_config(spec: RowSpec, paths: Paths, run_dir: Path) -> dict[str, Any]:
    """The NeMo-RL config of one row: overrides over the workload's example config."""
    lay = spec.layout
    if paths.nemo_rl_dir is None:
        raise ValueError("nemo_rl_dir is not set (--nemo-rl-dir): the config inherits from its example configs")
    total, data, env, gen = _workload(spec, paths)
    model = str(paths.checkpoint(spec, spec.model_checkpoint))
    generation: dict[str, Any] = {
        "vllm_cfg": {"tensor_parallel_size": lay.vllm_tp, "expert_parallel_size": lay.vllm_ep,
                     "max_model_len": total},
    }
    for key, value in gen.items():
        generation[key] = {**generation.get(key, {}), **value} if isinstance(value, dict) else value
    if spec.family is not None:
        generation["vllm_kwargs"] = {"speculative_config": speculative_config(spec, paths)}
    cfg: dict[str, Any] = {
        "defaults": str(paths.nemo_rl_dir / spec.workload.example),
        "grpo": {"num_prompts_per_step": spec.grpo["num_prompts_per_step"],
                 "num_generations_per_prompt": spec.grpo["num_generations_per_prompt"],
                 "max_num_steps": spec.max_num_steps, "val_period": spec.val_period},
        "checkpointing": {"enabled": spec.checkpointing, "checkpoint_dir": str(run_dir / CHECKPOINT_DIR_NAME)},
        "policy": {
            "model_name": model,
            "tokenizer": {"name": model},
            "train_global_batch_size": spec.grpo["train_global_batch_size"],
            "max_total_sequence_length": total,
            # Load-balanced zigzag CP splits each sequence into 2 x CP chunks, each TP-divisible.
            "make_sequence_length_divisible_by": lay.tp * 2 * lay.cp,
            "dtensor_cfg": {"enabled": False},
            "megatron_cfg": {"enabled": True, "tensor_model_parallel_size": lay.tp,
                             "pipeline_model_parallel_size": lay.pp, "context_parallel_size": lay.cp,
                             "expert_model_parallel_size": lay.ep, "sequence_parallel": False},
            # The paper trains on packed sequences under CP (PR 4059 brings packing to the drafts).
            "sequence_packing": {"enabled": spec.sequence_packing},
            "draft": draft_block(spec, paths),
            "generation": generation,
        },
        "data": data,
        "logger": {"log_dir": str(run_dir / LOG_DIR_NAME), "wandb_enabled": True, "tensorboard_enabled": False,
                   "wandb": wandb_names(spec)},
        "cluster": {"gpus_per_node": lay.gpus_per_node, "num_nodes": lay.nodes},
    }
    if env:
        cfg["env"] = env
    return merge(cfg, spec.workload.overrides)


def without_overrides(cfg: dict[str, Any], spec: RowSpec) -> dict[str, Any]:
    """``cfg`` less the workload's config_overrides: keys the example lacks on purpose, which the skeleton
    check (the example's own keys) would call unknown; NeMo-RL's MasterConfig checks them instead."""
    def drop(node: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        out = dict(node)
        for key, value in over.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = drop(out[key], value)
            else:
                out.pop(key, None)
        return out
    return drop(cfg, spec.workload.overrides)


def config_yaml(cfg: dict[str, Any], spec: RowSpec, checked_against: str) -> str:
    header = (f"# NeMo-RL GRPO config of paper row {spec.row!r} ({spec.artifact}, profile {spec.profile}),\n"
              f"# {layout_note(spec)};\n"
              f"# generated by integrations.nemo_rl; checked against {checked_against}.\n")
    return header + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False, width=110)


def write_config(cfg: dict[str, Any], spec: RowSpec, run_dir: Path, checked_against: str,
                 name: str = CONFIG_NAME) -> Path:
    return write_atomic(run_dir / name, config_yaml(cfg, spec, checked_against))
