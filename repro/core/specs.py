"""The settings of a run's parts, shared by the profile model and the run config: policy, draft, GRPO, workload, SFT.

Each is a pydantic dataclass: built from a profile section it rejects unknown keys and wrong types (naming them),
and its ``validate()`` checks the values, raising ``ConfigError`` with the key, the bad value and what was
expected. ``repro.core.profile`` validates every profile through them before any job runs; ``repro.rl.config``
composes them into one run's ``RunConfig``.

    DraftSpec(family="dflash", num_proposals=3, options={"block_size": 4}).validate()
"""
from __future__ import annotations

import json
from dataclasses import field
from pathlib import Path
from typing import Any, Mapping

from pydantic import ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError
from pydantic.dataclasses import dataclass

from kernels.backend_names import NAMES as BACKEND_NAMES  # torch-free, so a profile validates without torch

POLICY_FAMILIES = ("qwen3", "qwen3_moe", "llama", "gpt_oss")
POLICY_SCALES = ("tiny", "gpu")
DRAFT_FAMILIES = ("eagle3", "dflash", "dspark")
DRAFT_CHECKPOINT_FAMILIES = ("eagle3",)   # drafts that can start from a released checkpoint (DraftSpec.checkpoint)
WORKLOADS = ("math", "workplace")
MATH_OPS = (2, 3)          # operations per math problem: training problems lo..hi, held-out problems hi
MAX_MATH_OPS = 16
DTYPES = ("float32", "bfloat16", "float16")
ARTIFACTS = ("table1", "table2", "fig3", "fig4")
# the engine's modes (repro.rollout.engine, docs/engine.md), here so that configs check them without importing it
CUDA_GRAPH_MODES = ("off", "draft", "all", "whole_drafts", "compiled", "compiled_drafts", "fused")
ROLLOUT_BACKENDS = ("suite", "vllm")   # repro.rollout.engine.RolloutEngine | integrations.vllm.engine (EAGLE-3)
# DraftSpec.options keys per family; attn_backend (every family): the kernels.attention backend of the draft's
# training attention ("auto" by default)
_BLOCK_OPTIONS = ("num_layers", "block_size", "num_anchors", "decay_gamma", "attn_backend")
# draft_vocab_size (EAGLE-3): the reduced draft vocabulary, the most frequent tokens of the SFT demonstrations
DRAFT_OPTIONS = {"eagle3": ("ttt_steps", "decay", "pass_weights", "draft_vocab_size", "attn_backend"),
                 "dflash": _BLOCK_OPTIONS,
                 "dspark": _BLOCK_OPTIONS + ("markov_rank",)}


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key, the value and what was expected."""


# Unknown keys and wrong types are refused when a spec is built; values are checked by ``validate()``.
SPEC_CONFIG = ConfigDict(extra="forbid")


def _check(cond: bool, key: str, value: Any, expected: str) -> None:
    if not cond:
        raise ConfigError(f"config {key}={value!r} is invalid: expected {expected}")


@dataclass(config=SPEC_CONFIG)
class PolicySpec:
    family: StrictStr | None = "qwen3"     # None: any model_type a checkpoint has (checkpoint policies)
    scale: StrictStr = "tiny"
    overrides: dict = field(default_factory=dict)      # HF config keys (hidden_size, num_hidden_layers, ...)
    # A real checkpoint instead of a random init (paper profiles run with --engine suite): ``checkpoint``
    # is a key of the profile's ``checkpoints:``, ``path`` its folder under checkpoint_root (filled by
    # run_config_from_profile), ``tokens`` the checkpoint tokenizer's tokens for the workloads' roles
    # (repro.rl.hf_tokenizer.ROLES: a token string or an id each).
    checkpoint: StrictStr = ""
    path: StrictStr = ""
    tokens: dict = field(default_factory=dict)

    def validate(self, key: str = "policy", paths: bool = True) -> None:
        """Check every value; ``paths=False`` leaves out the checkpoint's files (a profile is checked before the
        user's checkpoint_root is known)."""
        _check(isinstance(self.overrides, dict), f"{key}.overrides", self.overrides, "a mapping")
        if self.checkpoint:
            self._validate_checkpoint(key, paths)
            return
        _check(self.family in POLICY_FAMILIES, f"{key}.family", self.family, f"one of {POLICY_FAMILIES}")
        _check(self.scale in POLICY_SCALES, f"{key}.scale", self.scale, f"one of {POLICY_SCALES}")
        for k, v in self.overrides.items():
            if k.startswith("num_") or k in ("hidden_size", "intermediate_size", "head_dim"):
                _check(isinstance(v, int) and v >= 1, f"{key}.overrides.{k}", v, "a positive integer")

    def _validate_checkpoint(self, key: str, paths: bool) -> None:
        """The checkpoint's folder and config.json exist and match ``family`` (reads config.json only)."""
        _check(not self.overrides, f"{key}.overrides", self.overrides,
               f"no overrides with checkpoint {self.checkpoint!r} (a checkpoint's shape is its config.json)")
        _check(isinstance(self.tokens, dict), f"{key}.tokens", self.tokens, "a mapping role -> token or id")
        if not paths:
            return
        how = ("set --checkpoint-root /path (workflow: --config checkpoint_root=/path) to the folder that holds "
               "the profile's checkpoints: entries")
        if not self.path:
            raise ConfigError(f"config {key}.checkpoint={self.checkpoint!r} has no path: checkpoint_root is not "
                              f"set; {how}")
        cfg = checkpoint_config_path(self.path)
        if not cfg.is_file():
            what = "does not exist" if not Path(self.path).is_dir() else "has no config.json"
            raise ConfigError(f"config {key}.checkpoint={self.checkpoint!r} is invalid: its folder {self.path} "
                              f"{what}; expected a local HF checkpoint (config.json, *.safetensors, tokenizer "
                              f"files); {how}")
        model_type = read_checkpoint_config(self.path).get("model_type")
        _check(not self.family or self.family == model_type, f"{key}.family", self.family,
               f"{model_type!r}, the model_type of checkpoint {self.checkpoint!r} ({cfg})")


def checkpoint_config_path(path: str | Path) -> Path:
    return Path(path) / "config.json"


def read_checkpoint_config(path: str | Path) -> dict:
    """A checkpoint's config.json as a dict (cheap: nothing is built)."""
    return json.loads(checkpoint_config_path(path).read_text())


@dataclass(config=SPEC_CONFIG)
class DraftSpec:
    family: StrictStr = "eagle3"
    loss_weight: StrictFloat = 1.0           # lambda in L = L_RL + lambda * L_draft
    lr: StrictFloat = 1e-3
    max_grad_norm: StrictFloat = 1.0
    num_proposals: StrictInt = 3             # k proposals per verify step
    options: dict = field(default_factory=dict)   # family options (ttt_steps, block_size, num_layers, ...)
    # A released draft to start from instead of a random init (a warm start; families in
    # DRAFT_CHECKPOINT_FAMILIES): ``checkpoint`` is a key of the profile's ``checkpoints:``, ``path`` its
    # folder under checkpoint_root (filled by run_config_from_profile, as for PolicySpec). The draft takes
    # the checkpoint's shape (integrations.vllm.load.build_eagle3_from_checkpoint).
    checkpoint: StrictStr = ""
    path: StrictStr = ""
    # Rows per draft-loss call; 0: the policy's microbatch (the draft runs inside each policy microbatch).
    # Larger: the microbatches' detached taps are kept and the draft runs after the policy's backward over
    # chunks of this many rows (fewer, larger draft calls: the draft's host cost per update falls).
    microbatch: StrictInt = 0
    # The draft's deferred training step (loss + backward, on its padded route) replayed as a CUDA graph per batch
    # shape (repro.rl.draft_graph); needs microbatch > grpo.microbatch. Eager on CPU.
    cuda_graph: StrictBool = False
    # The draft group's learning rate rises linearly over its first this many updates (0: constant). Adam's first
    # step moves every parameter by about lr whatever the gradient's size, which undoes much of a warm-started
    # draft (repro.rl.joint.set_draft_lr).
    lr_warmup_steps: StrictInt = 0

    def validate(self, key: str = "draft", paths: bool = True) -> None:
        """Check every value; ``paths=False`` leaves out the checkpoint's files (as PolicySpec.validate)."""
        _check(self.family in DRAFT_FAMILIES, f"{key}.family", self.family, f"one of {DRAFT_FAMILIES}")
        _check(self.loss_weight >= 0, f"{key}.loss_weight", self.loss_weight, "a number >= 0")
        _check(self.lr > 0, f"{key}.lr", self.lr, "a positive learning rate")
        _check(self.max_grad_norm > 0, f"{key}.max_grad_norm", self.max_grad_norm, "a positive number")
        _check(isinstance(self.num_proposals, int) and 1 <= self.num_proposals <= 32, f"{key}.num_proposals",
               self.num_proposals, "an integer in [1, 32]")
        _check(isinstance(self.microbatch, int) and not isinstance(self.microbatch, bool) and self.microbatch >= 0,
               f"{key}.microbatch", self.microbatch, "an integer >= 0 (0: the policy's microbatch)")
        _check(isinstance(self.cuda_graph, bool), f"{key}.cuda_graph", self.cuda_graph, "true or false")
        _check(isinstance(self.lr_warmup_steps, int) and not isinstance(self.lr_warmup_steps, bool)
               and self.lr_warmup_steps >= 0, f"{key}.lr_warmup_steps", self.lr_warmup_steps,
               "an integer >= 0 (0: no warm-up)")
        self._validate_options(key)
        if self.checkpoint:
            self._validate_checkpoint(key, paths)

    def _validate_options(self, key: str) -> None:
        """The family's option keys, the attention backend's name, and a block draft's proposal count."""
        allowed = DRAFT_OPTIONS.get(self.family, ())
        bad = sorted(set(self.options) - set(allowed))
        _check(not bad, f"{key}.options", bad, f"keys among {list(allowed)} for family {self.family!r}")
        backend = self.options.get("attn_backend", "auto")
        _check(backend in BACKEND_NAMES, f"{key}.options.attn_backend", backend,
               f"one of {list(BACKEND_NAMES)}")
        vd = self.options.get("draft_vocab_size", 0)
        _check(isinstance(vd, int) and not isinstance(vd, bool) and vd >= 0 and not (vd and self.checkpoint),
               f"{key}.options.draft_vocab_size", vd, "an integer >= 0 (0: the full vocabulary), and none with a "
               "checkpoint (its own vocabulary applies)")
        if self.family in ("dflash", "dspark"):
            bs = self.options.get("block_size", 8)
            _check(isinstance(bs, int) and not isinstance(bs, bool) and bs >= 2, f"{key}.options.block_size", bs,
                   "an integer >= 2")
            k = bs if self.family == "dspark" else bs - 1
            _check(self.num_proposals == k, f"{key}.num_proposals", self.num_proposals,
                   f"{k} for {self.family} with block_size={bs} (one block per verify step)")

    def _validate_checkpoint(self, key: str, paths: bool) -> None:
        """The checkpoint's folder, config.json and weights exist (nothing is read but the listing)."""
        _check(self.family in DRAFT_CHECKPOINT_FAMILIES, f"{key}.checkpoint", self.checkpoint,
               f"no checkpoint for family {self.family!r}: only {DRAFT_CHECKPOINT_FAMILIES} drafts load released "
               "checkpoints so far (the others start from their random init)")
        if not paths:
            return
        how = ("set --checkpoint-root /path (workflow: --config checkpoint_root=/path) to the folder that holds "
               "the profile's checkpoints: entries")
        if not self.path:
            raise ConfigError(f"config {key}.checkpoint={self.checkpoint!r} has no path: checkpoint_root is not "
                              f"set; {how}")
        root, what = Path(self.path), ""
        if not root.is_dir():
            what = "does not exist"
        elif not checkpoint_config_path(root).is_file():
            what = "has no config.json"
        elif not any(root.glob("*.safetensors")) and not any(root.glob("pytorch_model*.bin")):
            what = "has no *.safetensors or pytorch_model*.bin weights"
        if what:
            raise ConfigError(f"config {key}.checkpoint={self.checkpoint!r} is invalid: its folder {self.path} "
                              f"{what}; expected a released {self.family} draft (config.json and weights, the "
                              f"layout vLLM loads); {how}")


@dataclass(config=SPEC_CONFIG)
class GRPOSpec:
    prompts_per_step: StrictInt = 4
    generations_per_prompt: StrictInt = 4
    max_new_tokens: StrictInt = 48
    temperature: StrictFloat = 1.0
    lr: StrictFloat = 1e-4
    clip_eps: StrictFloat = 0.2
    kl_coef: StrictFloat = 0.0               # KL(policy || reference) weight; 0 disables the reference model
    max_grad_norm: StrictFloat = 1.0
    microbatch: StrictInt = 8                # sequences per forward/backward in the update
    normalize_std: StrictBool = True         # divide group-centred rewards by the group's std
    # the update's policy forward (and so its backward) with the decoder layers compiled by inductor, one
    # compilation for every layer (repro.rollout.compiled_layers); the single-process update only
    compile_layers: StrictBool = False

    @property
    def rows_per_step(self) -> int:
        """Sequences a step rolls out and updates on: every prompt's group."""
        return self.prompts_per_step * self.generations_per_prompt

    def validate(self, key: str = "grpo") -> None:
        for name in ("prompts_per_step", "generations_per_prompt", "max_new_tokens", "microbatch"):
            v = getattr(self, name)
            _check(isinstance(v, int) and v >= 1, f"{key}.{name}", v, "a positive integer")
        _check(self.generations_per_prompt >= 2, f"{key}.generations_per_prompt", self.generations_per_prompt,
               ">= 2 (group-relative advantages need a group)")
        _check(self.temperature > 0, f"{key}.temperature", self.temperature, "> 0 (GRPO samples)")
        _check(self.lr > 0, f"{key}.lr", self.lr, "a positive learning rate")
        _check(0 < self.clip_eps < 1, f"{key}.clip_eps", self.clip_eps, "a number in (0, 1)")
        _check(self.kl_coef >= 0, f"{key}.kl_coef", self.kl_coef, ">= 0")
        _check(self.max_grad_norm > 0, f"{key}.max_grad_norm", self.max_grad_norm, "a positive number")


@dataclass(config=SPEC_CONFIG)
class WorkloadSpec:
    name: StrictStr = "math"
    tool_latency_s: StrictFloat = 0.0        # workplace: seconds per tool call (a tool server's round trip)
    max_tool_calls: StrictInt = 4
    val_every: StrictInt = 5                 # validation accuracy every N steps (and at the last step)
    val_size: StrictInt = 30
    # math: each training problem has lo..hi operations, each held-out problem hi (the worked solution writes a line
    # per operation, so this sets the response length and with it the rollout's share of a step)
    math_ops: tuple[StrictInt, StrictInt] = MATH_OPS

    def validate(self, key: str = "workload") -> None:
        _check(self.name in WORKLOADS, f"{key}.name", self.name, f"one of {WORKLOADS}")
        _check(self.tool_latency_s >= 0, f"{key}.tool_latency_s", self.tool_latency_s, ">= 0")
        _check(isinstance(self.max_tool_calls, int) and self.max_tool_calls >= 1, f"{key}.max_tool_calls",
               self.max_tool_calls, "a positive integer")
        _check(isinstance(self.val_every, int) and self.val_every >= 1, f"{key}.val_every", self.val_every,
               "a positive integer")
        _check(isinstance(self.val_size, int) and 1 <= self.val_size <= 30, f"{key}.val_size", self.val_size,
               "an integer in [1, 30] (the held-out split has 30 problems, like AIME 2024)")
        lo, hi = self.math_ops
        _check(1 <= lo <= hi <= MAX_MATH_OPS, f"{key}.math_ops", list(self.math_ops),
               f"[lo, hi] with 1 <= lo <= hi <= {MAX_MATH_OPS} (operations per math problem)")


@dataclass(config=SPEC_CONFIG)
class SFTSpec:
    steps: StrictInt = 300
    batch: StrictInt = 32
    lr: StrictFloat = 3e-3
    draft_steps: StrictInt = 200             # warm start of each draft family on the SFT policy's features
    # The workload whose demonstrations the drafts are trained on offline ("": the run's own). The paper's drafts
    # are trained offline on other data than the RL task and adapt to it online; the same workload makes them
    # in-domain from the first step.
    draft_workload: StrictStr = ""
    # Train the drafts with torch's deterministic kernels. On a GPU the block drafts' masked training attention runs
    # SDPA's memory-efficient kernel, whose backward accumulates in a varying order by default, so their offline
    # training does not reproduce bit for bit (results/1xh200/h200/determinism/); the policy's SFT and EAGLE-3's do.
    deterministic: StrictBool = False

    def validate(self, key: str = "sft") -> None:
        for name in ("steps", "batch"):
            v = getattr(self, name)
            _check(isinstance(v, int) and v >= 1, f"{key}.{name}", v, "a positive integer")
        _check(isinstance(self.draft_steps, int) and self.draft_steps >= 0, f"{key}.draft_steps",
               self.draft_steps, "an integer >= 0")
        _check(self.lr > 0, f"{key}.lr", self.lr, "a positive learning rate")
        _check(self.draft_workload in ("", *WORKLOADS), f"{key}.draft_workload", self.draft_workload,
               f"'' (the run's workload) or one of {WORKLOADS}")
        _check(isinstance(self.deterministic, bool), f"{key}.deterministic", self.deterministic, "true or false")


def sft_spec(rl: Mapping[str, Any], workload: str) -> SFTSpec:
    """The SFT settings of ``workload``: ``rl.sft``, with ``rl.sft.workloads.<workload>`` over them (a workload
    that a GPU-sized policy learns completely in the common number of steps gets fewer, so RL has room)."""
    base = dict(rl.get("sft") or {})
    per = base.pop("workloads", None) or {}
    if not isinstance(per, Mapping) or not all(isinstance(v, Mapping) for v in per.values()):
        raise ConfigError(f"config rl.sft.workloads={per!r} is invalid: expected a mapping of workload name to "
                          "SFT settings, e.g. {workplace: {steps: 40}}")
    unknown = sorted(set(per) - set(WORKLOADS))
    if unknown:
        raise ConfigError(f"config rl.sft.workloads has unknown workloads {unknown}: expected some of {WORKLOADS}")
    try:
        return SFTSpec(**{**base, **(per.get(workload) or {})})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        if err["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            raise ConfigError(f"config rl.sft.{field}: unknown key {field!r}; expected one of "
                              f"{', '.join(sorted(vars(SFTSpec())))}, workloads") from None
        raise ConfigError(f"config rl.sft is invalid ({spec_error(exc)})") from None


def spec_error(exc: ValidationError) -> str:
    """A spec's construction error in one line: the key and what was wrong with it."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(x) for x in err["loc"])
        what = "unknown key" if err["type"] in ("unexpected_keyword_argument", "extra_forbidden") else err["msg"]
        parts.append(f"{where}: {what}" + ("" if err["type"].startswith(("unexpected", "extra")) else
                                           f" (got {err.get('input')!r})"))
    return "; ".join(parts)


def require_device(device: str, profile: str) -> None:
    """Refuse, before anything is written, a run whose profile needs a device this machine does not have."""
    if device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            raise ConfigError(f"profile {profile!r} runs on {device!r}, but this machine has no CUDA device "
                              "(torch.cuda.is_available() is False): run it on a GPU machine, or choose a CPU profile "
                              "such as cpu-tiny")
