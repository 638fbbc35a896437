"""The profile model: a hardware profile (experiments/profiles/<name>.yaml) parsed once into a typed, strict tree.

Every section is typed here, artifact sections included: an unknown key, a wrong type or a bad value fails before
any job, naming the file, the section, the key, the value and what was expected. The rl: parts are the specs of
``repro.core.specs`` (the run config is built from them); the benchmark sections (fig5, fig6, fig7, decode) hold
what their programs run at this scale, so adding a profile needs no code. Rows are checked against what they name
(policies, drafts, baselines, checkpoints) and every RL row's effective settings (the rl: section with the
artifact's and the row's overrides) are built and validated. A profile may name another it ``extends:``: its
sections are laid over that one's (mappings merged key by key, anything else replaced; null drops a section).

    profile = load_profile_model("cpu-tiny")     # the typed tree
    raw = load_profile("cpu-tiny")               # the same file as a plain dict, validated by the model
    python -m repro.core.profile cpu-tiny        # validate, and check this machine can serve it
    python -m repro.core.profile --list
    python -m repro.core.profile --schema        # the model as JSON schema
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from repro.core.provenance import REPO_ROOT, hardware
from repro.core.specs import ARTIFACTS as RL_ARTIFACTS
from repro.core.specs import (
    CUDA_GRAPH_MODES,
    ROLLOUT_BACKENDS,
    ConfigError,
    DraftSpec,
    GRPOSpec,
    PolicySpec,
    WorkloadSpec,
    sft_spec,
)

PROFILE_DIR = REPO_ROOT / "experiments" / "profiles"
BENCH_ARTIFACTS = ("fig5", "fig6", "fig7", "decode")

PosInt = Annotated[StrictInt, Field(ge=1)]
NonNegInt = Annotated[StrictInt, Field(ge=0)]
PosFloat = Annotated[StrictFloat, Field(gt=0)]
DType = Literal["float32", "bfloat16", "float16"]


class ProfileError(ConfigError):
    """A profile that does not exist, does not validate, or that this machine cannot serve."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- machine, ceilings ------------------------------------------------------------------------------------------
class Hardware(Section):
    device: Literal["cpu", "cuda"]
    gpus: NonNegInt
    gpu_model: StrictStr | None = Field(None, description="substring the detected GPU name must contain")
    min_gpu_memory_gb: Annotated[StrictFloat, Field(ge=0)] | None = None
    min_cpu_cores: PosInt = 1
    min_memory_gb: Annotated[StrictFloat, Field(ge=0)] = 0.0


class Envcheck(Section):
    matmul_size: Annotated[StrictInt, Field(ge=64)]
    matmul_repeats: PosInt
    copy_mb: PosInt
    copy_repeats: PosInt


# -- rl: the suite engine's co-training runs --------------------------------------------------------------------
class Mesh(Section):
    pp: PosInt
    cp: PosInt


class Rollout(Section):
    cuda_graphs: Literal[CUDA_GRAPH_MODES] = "off"   # type: ignore[valid-type]
    bucket_batch: StrictBool = False


class SFT(Section):
    """rl.sft: the SFT spec's keys, with per-workload overrides (``workloads: {workplace: {steps: 80}}``)."""
    model_config = ConfigDict(extra="allow", frozen=True)     # the SFT spec's keys, checked by sft_spec
    workloads: dict[Literal["math", "workplace"], dict[str, Any]] = {}


class RL(Section):
    vocab_size: Annotated[StrictInt, Field(ge=265)] = 512
    policies: dict[str, dict[str, Any]] = {}       # PolicySpec keys + mesh; checked in Profile._check_rl
    drafts: dict[str, DraftSpec] = {}
    grpo: GRPOSpec = GRPOSpec()
    workload: WorkloadSpec = WorkloadSpec()
    sft: SFT = SFT()
    rollout: Rollout = Rollout()
    manual_gc_interval: NonNegInt = 0
    ckpt_every: NonNegInt = 10                     # steps between checkpoints (0: none; a finished run deletes it)
    rollout_backend: Literal[ROLLOUT_BACKENDS] = "suite"   # type: ignore[valid-type]


class Row(Section):
    policy: StrictStr = "dense"
    draft: StrictStr | None = None
    baseline: StrictStr | None = None
    steps: PosInt | None = None
    draft_overrides: dict[str, Any] = {}
    rollout_backend: Literal[ROLLOUT_BACKENDS] | None = None   # type: ignore[valid-type]


class PPProbe(Section):
    """After training, a few joint updates split into pipeline stages with a TapChannel (Table 2's tap wait)."""
    stages: Annotated[StrictInt, Field(ge=2)] = 2
    updates: PosInt = 3
    microbatches: PosInt = 4
    transport: StrictStr = "shm"


class RLArtifact(Section):
    """table1, table2, fig3, fig4: the rows and how they are measured; overrides of the rl: section."""
    steps: PosInt = 10
    skip_steps: NonNegInt = 0
    rows: dict[str, Row]
    lockstep: StrictBool = False
    pp_probe: PPProbe | None = None
    baseline_seeds: list[NonNegInt] = []
    workload: dict[str, Any] = {}
    grpo: dict[str, Any] = {}
    rollout: dict[str, Any] = {}
    ckpt_every: NonNegInt | None = None
    manual_gc_interval: NonNegInt | None = None
    rollout_backend: Literal[ROLLOUT_BACKENDS] | None = None   # type: ignore[valid-type]

    @model_validator(mode="after")
    def _rows_hold_together(self) -> "RLArtifact":
        if not self.rows:
            raise ValueError("rows: expected at least one row")
        for label, row in self.rows.items():
            if row.baseline is not None and row.baseline not in self.rows:
                raise ValueError(f"rows[{label!r}].baseline={row.baseline!r} is invalid: expected one of the "
                                 f"section's rows {sorted(self.rows)}")
        if len(set(self.baseline_seeds)) != len(self.baseline_seeds):
            raise ValueError(f"baseline_seeds={self.baseline_seeds} is invalid: expected distinct seeds")
        return self


# -- benchmark artifacts ----------------------------------------------------------------------------------------
class Fig5(Section):
    """Packed zigzag CP vs SpecForge's USP splits, EAGLE-3 TTT (repro.bench.fig5)."""
    scale: PosInt = Field(description="divides the paper's lengths (longest 20,480 tokens)")
    heads: PosInt
    kv_heads: PosInt
    head_dim: PosInt
    dtype: DType
    cp: list[PosInt]
    repeats: PosInt
    warmup: NonNegInt
    backend: StrictStr = "auto"            # the kernels.attention backend of both methods


class Fig6(Section):
    """Draft-training attention at fixed global lengths across CP sizes (repro.bench.fig6)."""
    tokens: list[PosInt]
    cp: list[PosInt]
    heads: PosInt
    kv_heads: PosInt
    head_dim: PosInt
    dtype: DType
    anchors: PosInt
    block: PosInt
    repeats: PosInt
    warmup: NonNegInt
    passes: PosInt = 3                     # TTT passes
    backend: StrictStr = "auto"            # the backend of the ttt and trunk rows
    kinds: list[Literal["ttt", "trunk", "sdpa_cudnn", "block"]] = ["ttt", "trunk", "block"]
    block_routes: dict[str, StrictStr] = {"block": "auto"}   # label -> backend of the block-draft rows, timed together


class PaddedCheck(Section):
    rows: PosInt
    blocks: PosInt
    block: PosInt
    lengths: list[PosInt]
    modes: list[Literal["default", "deterministic", "math"]]


class AttentionCheck(Section):
    """Every attention path against the fp64 reference before fig5/fig6 (repro.bench.attention_check)."""
    device: Literal["cpu", "cuda"]
    dtype: DType
    backends: list[StrictStr]
    require: list[StrictStr] = []          # backends whose absence fails the check
    heads: PosInt
    kv_heads: PosInt
    head_dim: PosInt
    lengths: list[PosInt]
    block: PosInt
    padded: PaddedCheck
    ring_world: list[PosInt] = [1, 2]


class Fig7(Section):
    """PP fan-in of taps into the draft's stage, TapChannel vs host staging (repro.bench.fig7)."""
    device: Literal["cpu", "cuda"]
    transports: list[StrictStr]
    hidden: PosInt
    tokens: list[PosInt]
    dtype: DType
    compute_scale: PosFloat
    repeats: PosInt
    warmup: NonNegInt
    pp: Annotated[StrictInt, Field(ge=2)] = 4
    layouts: list[StrictStr] = ["eagle3", "dflash"]


class Decode(Section):
    """Decoding speed of the rollout engine, plain and with each draft, beside its peers (repro.bench.decode): a
    policy pre-trained briefly on a synthetic Markov language, drafts trained on its samples, then timed."""
    scale: Literal["tiny", "gpu"]              # policy scale of repro.models.policy
    vocab_size: Annotated[StrictInt, Field(ge=3)]   # policy vocabulary (the block drafts' MASK is its last id)
    lang_tokens: Annotated[StrictInt, Field(ge=2)]  # tokens of the synthetic language (< vocab_size)
    policy_overrides: dict[str, StrictInt] = {}     # HF config overrides (layers, hidden size, heads...)
    pretrain_steps: PosInt = 200
    pretrain_batch: PosInt = 16
    pretrain_len: PosInt = 64
    pretrain_lr: PosFloat = 3e-3
    train_prompts: PosInt = 64                 # prompts whose policy samples train the drafts
    prompt_len: PosInt = 8
    sample_tokens: PosInt = 32
    train_steps: PosInt = 80                   # draft training steps per family
    train_batch: PosInt = 16
    lr: PosFloat = 3e-3
    new_tokens: PosInt = 32                    # tokens generated per row in every timed call
    temperature: PosFloat = 1.0
    batch_sizes: tuple[PosInt, ...] = (1, 4, 16, 64)
    repeats: PosInt = 3                        # timed calls per point (after one warm-up call)
    eagle_k: PosInt = 3                        # EAGLE-3 proposals per step (= its TTT passes)
    block_size: Annotated[StrictInt, Field(ge=2)] = 4   # DFlash/DSpark block (proposals: block - 1 / block)
    block_layers: PosInt = 2
    draft_dtype: DType = "float32"             # draft master weights
    families: tuple[Literal["eagle3", "dflash", "dspark"], ...] = ("eagle3", "dflash", "dspark")
    engine_modes: tuple[Literal[CUDA_GRAPH_MODES], ...] = ("off", "all")   # type: ignore[valid-type]
    peers: tuple[Literal["hf-static-compile", "hf-dynamic", "vllm"], ...] = ("hf-static-compile", "hf-dynamic",
                                                                             "vllm")
    threads: NonNegInt = 0                     # torch intra-op threads (0: torch's default)
    self_check_tokens: PosInt = 24
    # seconds from the start after which points not yet started are skipped (listed in the run's config), so a run
    # under a time limit still ends with its bench.json; None: no limit
    deadline_s: PosFloat | None = None

    @model_validator(mode="before")
    @classmethod
    def _yaml_off(cls, data):
        """YAML 1.1 reads a bare ``off`` as false: in engine_modes it means the mode "off"."""
        if isinstance(data, Mapping) and isinstance(data.get("engine_modes"), (list, tuple)):
            data = {**data, "engine_modes": ["off" if m is False else m for m in data["engine_modes"]]}
        return data

    @model_validator(mode="after")
    def _checked(self) -> Decode:
        if not self.lang_tokens < self.vocab_size:
            raise ValueError(f"decode.lang_tokens={self.lang_tokens} is invalid: expected an integer in "
                             f"(1, vocab_size={self.vocab_size}) (the last id is the MASK)")
        if not self.batch_sizes or not self.engine_modes:
            raise ValueError("decode.batch_sizes and decode.engine_modes must name at least one value")
        return self


# -- paper scale through NeMo-RL --------------------------------------------------------------------------------
class NemoModel(Section):
    checkpoint: StrictStr
    nodes: PosInt
    parallel: dict[Literal["tp", "pp", "cp", "ep"], PosInt]
    vllm: dict[Literal["tp", "ep"], PosInt]


class NemoWorkload(Section):
    model_config = ConfigDict(extra="allow", frozen=True)   # the workload's NeMo-RL settings (data, lengths)
    example: StrictStr
    entry: StrictStr


class NemoDraft(Section):
    model_config = ConfigDict(extra="allow", frozen=True)   # NeMo-RL policy.draft keys, checked against a checkout
    name: StrictStr
    method: Literal["eagle3", "dflash", "dspark"]


class NemoDraftCheckpoint(Section):
    checkpoint: StrictStr
    block_size: PosInt | None = None


class NemoArtifact(Section):
    val_period: NonNegInt
    checkpointing: StrictBool


class NemoRL(Section):
    gpus_per_node: PosInt
    grpo: dict[Literal["num_prompts_per_step", "num_generations_per_prompt", "train_global_batch_size"], PosInt]
    artifacts: dict[Literal[RL_ARTIFACTS], NemoArtifact]    # type: ignore[valid-type]
    workloads: dict[Literal["math", "workplace"], NemoWorkload]
    models: dict[str, NemoModel]
    drafts: dict[Literal["eagle3", "dflash", "dspark"], NemoDraft]
    draft_checkpoints: dict[str, NemoDraftCheckpoint] = {}


# -- the profile ------------------------------------------------------------------------------------------------
class Profile(Section):
    name: Annotated[StrictStr, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    description: StrictStr
    hardware: Hardware
    dtype: DType
    workload_scale: Literal["scaled", "paper"]
    engine: Literal["suite", "nemo-rl"]
    checkpoints: dict[str, StrictStr] = {}
    envcheck: Envcheck
    rl: RL | None = None
    table1: RLArtifact | None = None
    table2: RLArtifact | None = None
    fig3: RLArtifact | None = None
    fig4: RLArtifact | None = None
    fig5: Fig5 | None = None
    fig6: Fig6 | None = None
    fig7: Fig7 | None = None
    decode: Decode | None = None
    attention_check: AttentionCheck | None = None
    nemo_rl: NemoRL | None = None

    def rl_artifact(self, artifact: str) -> RLArtifact | None:
        return getattr(self, artifact) if artifact in RL_ARTIFACTS else None

    @model_validator(mode="after")
    def _check_references(self) -> "Profile":
        if self.engine == "nemo-rl" and self.nemo_rl is None:
            raise ValueError("engine: nemo-rl needs a nemo_rl: section (how each row becomes a NeMo-RL run)")
        if self.rl is not None:
            self._check_rl()
        for artifact in RL_ARTIFACTS:
            section = getattr(self, artifact)
            if section is not None:
                self._check_rows(artifact, section)
        return self

    def _check_rl(self) -> None:
        rl = self.rl
        for name, entry in rl.policies.items():
            key = f"rl.policies.{name}"
            fields = dict(entry)
            mesh = fields.pop("mesh", None)     # dist_run's default layout (--pp/--cp) of this policy
            if mesh is not None:
                _build(Mesh, mesh, f"{key}.mesh")
            spec = _build(PolicySpec, fields, key, also=("mesh",))
            if spec.checkpoint:
                self._check_checkpoint_key(spec.checkpoint, f"{key}.checkpoint")
            spec.validate(key, paths=False)             # the checkpoint's files are checked when a run starts
        for name, spec in rl.drafts.items():
            if spec.checkpoint:
                self._check_checkpoint_key(spec.checkpoint, f"rl.drafts.{name}.checkpoint")
            spec.validate(f"rl.drafts.{name}", paths=False)
        rl.grpo.validate("rl.grpo")
        rl.workload.validate("rl.workload")
        for workload in ("math", "workplace"):
            sft_spec({"sft": rl.sft.model_dump()}, workload).validate(f"rl.sft (workload {workload})")

    def _check_checkpoint_key(self, name: str, key: str) -> None:
        if name not in self.checkpoints:
            raise ValueError(f"{key}={name!r} is invalid: expected one of {sorted(self.checkpoints)} (checkpoints:)")

    def _check_rows(self, artifact: str, section: RLArtifact) -> None:
        if "math_ops" in section.workload:
            raise ValueError(f"{artifact}.workload.math_ops={section.workload['math_ops']!r} is invalid here: set "
                             "rl.workload.math_ops (the SFT warm start every math artifact shares is trained on it)")
        policies = set(self.rl.policies) if self.rl is not None else set()
        if self.nemo_rl is not None:
            policies |= set(self.nemo_rl.models)
        drafts = set(self.rl.drafts) if self.rl is not None else {"eagle3", "dflash", "dspark"}
        for label, row in section.rows.items():
            where = f"{artifact}.rows[{label!r}]"
            if row.policy not in policies:
                raise ValueError(f"{where}.policy={row.policy!r} is invalid: expected one of {sorted(policies)}")
            if row.draft is not None and row.draft not in drafts:
                raise ValueError(f"{where}.draft={row.draft!r} is invalid: expected one of {sorted(drafts)}")
            if self.rl is not None and row.policy in self.rl.policies:
                effective_specs(self, artifact, label)        # every override merges into valid specs


def _merge(base: Mapping[str, Any], over: Mapping[str, Any] | None) -> dict:
    out = dict(base)
    for k, v in (over or {}).items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _build(cls, data: Mapping[str, Any], key: str, also: tuple[str, ...] = ()):
    """``cls`` built from ``data`` (a model or a spec); its first key or type error as one ConfigError naming
    ``key`` and, for an unknown key, the keys ``cls`` accepts (and ``also``)."""
    try:
        return cls.model_validate(data) if isinstance(cls, type) and issubclass(cls, BaseModel) else cls(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        if err["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            keys = sorted({*(_fields_of(cls) or {}), *also})
            raise ConfigError(f"{key}.{field}: unknown key {field!r}; expected one of {', '.join(keys)}") from None
        raise ConfigError(f"{key}.{field}: {err.get('input')!r} is invalid: "
                          f"{err['msg'][:1].lower() + err['msg'][1:]}") from None


def _spec(cls, data: Mapping[str, Any], key: str):
    spec = _build(cls, data, key)
    spec.validate(key)
    return spec


def effective_specs(profile: Profile, artifact: str, row: str) -> dict[str, Any]:
    """The settings one RL row runs with: rl: merged with the artifact section's and the row's overrides, each part
    a validated spec (policy entry dict, DraftSpec or None, GRPOSpec, WorkloadSpec, rollout, steps, ...)."""
    rl, section = profile.rl, profile.rl_artifact(artifact)
    if rl is None or section is None:
        raise ConfigError(f"profile {profile.name!r} has no rl: section or no {artifact}: section")
    if row not in section.rows:
        raise ConfigError(f"config row={row!r} is invalid: expected one of {sorted(section.rows)} "
                          f"({artifact} rows of profile {profile.name!r})")
    spec = section.rows[row]
    where = f"{artifact}.rows[{row!r}]"
    if spec.policy not in rl.policies:
        raise ConfigError(f"config {where}.policy={spec.policy!r} is invalid: expected one of "
                          f"{sorted(rl.policies)} (rl.policies)")
    draft = None
    if spec.draft is not None:
        if spec.draft not in rl.drafts:
            raise ConfigError(f"config {where}.draft={spec.draft!r} is invalid: expected one of {sorted(rl.drafts)}"
                              " (rl.drafts)")
        merged = _merge(dataclasses.asdict(rl.drafts[spec.draft]), spec.draft_overrides)
        draft = _build(DraftSpec, merged, f"{where}.draft_overrides")
        draft.validate(f"{where}.draft_overrides", paths=False)
    workload = _spec(WorkloadSpec, _merge(dataclasses.asdict(rl.workload), section.workload), f"{artifact}.workload")
    grpo = _spec(GRPOSpec, _merge(dataclasses.asdict(rl.grpo), section.grpo), f"{artifact}.grpo")
    rollout = _build(Rollout, _merge(rl.rollout.model_dump(), section.rollout), f"{artifact}.rollout")
    return {"policy": dict(rl.policies[spec.policy]), "policy_name": spec.policy, "draft": draft, "grpo": grpo,
            "workload": workload, "sft": sft_spec({"sft": rl.sft.model_dump()}, workload.name), "rollout": rollout,
            "steps": spec.steps or section.steps,
            "rollout_backend": spec.rollout_backend or section.rollout_backend or rl.rollout_backend,
            "ckpt_every": section.ckpt_every if section.ckpt_every is not None else rl.ckpt_every,  # 0: none
            "manual_gc_interval": (section.manual_gc_interval if section.manual_gc_interval is not None
                                   else rl.manual_gc_interval)}


# -- loading ----------------------------------------------------------------------------------------------------
def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def profile_path(name_or_path: str | Path) -> Path:
    """experiments/profiles/<name>.yaml for a name; the file itself for a path ending in .yaml/.yml."""
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")):
        path = Path(text)
        if not path.is_file():
            raise ProfileError(f"profile file {path} does not exist")
        return path
    path = PROFILE_DIR / f"{text}.yaml"
    if not path.is_file():
        raise ProfileError(f"unknown profile {text!r}; expected one of {', '.join(available_profiles())} "
                           f"(files in {_shown(PROFILE_DIR)}), or a path to a profile .yaml file")
    return path


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML ({exc})") from exc


def merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` laid over ``base``: mappings merge key by key, anything else (lists, scalars, null) replaces."""
    out = dict(base)
    for key, value in override.items():
        out[key] = (merged(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
                    else value)
    return out


def _resolved(path: Path, chain: tuple[Path, ...] = ()) -> tuple[Any, tuple[Path, ...]]:
    """A profile file's data with the profile it ``extends:`` merged under it (recursively), and the files read."""
    data, chain = load_yaml(path), chain + (path.resolve(),)
    if not isinstance(data, Mapping) or "extends" not in data:
        return data, chain
    base_name = data["extends"]
    if not isinstance(base_name, str) or not base_name or base_name.endswith((".yaml", ".yml")):
        raise ProfileError(f"{_shown(path)}: extends {base_name!r} is invalid: expected the name of a profile in "
                           f"{_shown(PROFILE_DIR)} ({', '.join(available_profiles())})")
    base_path = profile_path(base_name)
    if base_path.resolve() in chain:
        raise ProfileError(f"{_shown(path)}: extends {base_name!r} runs in a circle: "
                           + " -> ".join(_shown(p) for p in chain + (base_path.resolve(),)))
    base, chain = _resolved(base_path, chain)
    if not isinstance(base, Mapping):
        raise ProfileError(f"{_shown(base_path)} (extended by {_shown(path)}): expected a mapping of sections, got "
                           f"{type(base).__name__}")
    return merged(base, {k: v for k, v in data.items() if k != "extends"}), chain


def _fields_of(tp) -> dict[str, Any] | None:
    """The keys a model or spec type accepts, with their types (None for anything else)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return {k: f.annotation for k, f in tp.model_fields.items()}
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return {f.name: hints.get(f.name) for f in dataclasses.fields(tp)}
    return None


def _unwrapped(tp: Any) -> Any:
    """``tp`` without Optional/Union and Annotated wrappers (their first non-None member)."""
    while typing.get_origin(tp) in (typing.Union, types.UnionType, Annotated):
        tp = [a for a in typing.get_args(tp) if a is not type(None)][0]
    return tp


def _type_at(loc: tuple) -> Any:
    """The declared type at ``loc`` inside Profile (for naming the keys an unknown key's section accepts)."""
    tp: Any = Profile
    for part in loc:
        tp = _unwrapped(tp)
        fields = _fields_of(tp)
        if fields is not None and part in fields:
            tp = fields[part]
        elif typing.get_origin(tp) in (dict, Mapping):
            tp = typing.get_args(tp)[1]
        elif typing.get_origin(tp) is list:
            tp = typing.get_args(tp)[0]
        else:
            return None
    return _unwrapped(tp)


def describe_error(err: dict) -> str:
    """One pydantic error as `section.key: problem` in the suite's words."""
    loc = tuple(err["loc"])
    where = ".".join(str(x) for x in loc) or "(top level)"
    kind, value = err["type"], err.get("input")
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        fields = _fields_of(_type_at(loc[:-1])) or {}
        return f"{where}: unknown key {loc[-1]!r}; expected one of {', '.join(sorted(fields))}"
    if kind == "missing":
        return f"{where}: missing; this key is required"
    if kind == "value_error":
        msg = str(err["msg"]).removeprefix("Value error, ")
        return msg if not loc else f"{where}: {msg}"
    return f"{where}: {value!r} is invalid: {err['msg'][:1].lower() + err['msg'][1:]}"


def parse_profile(data: Any, source: str) -> Profile:
    """Validate a profile's data; ProfileError naming ``source`` and every bad key otherwise."""
    if not isinstance(data, Mapping):
        raise ProfileError(f"{source}: expected a mapping of sections (name, hardware, rl, table1, ...), got "
                           f"{type(data).__name__}")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        lines = [describe_error(e) for e in exc.errors()]
        more = f" (and {len(lines) - 5} more)" if len(lines) > 5 else ""
        raise ProfileError(f"{source} is invalid: " + "; ".join(lines[:5]) + more) from None
    except ConfigError as exc:
        raise ProfileError(f"{source} is invalid: {exc}") from None


# per profile file: the modification times of the files it was read from (itself and what it extends), its model
# and data; a hit costs a stat per file, no parsing
_CACHE: dict[str, tuple[tuple[tuple[str, int], ...], Profile, dict]] = {}


def _stamps(files) -> tuple[tuple[str, int], ...]:
    return tuple((str(p), Path(p).stat().st_mtime_ns) for p in files)


def _load(name_or_path: str | Path) -> tuple[Profile, dict]:
    path = profile_path(name_or_path)
    hit = _CACHE.get(str(path.resolve()))
    if hit is None or _stamps(p for p, _ in hit[0]) != hit[0]:
        raw, chain = _resolved(path)
        model = parse_profile(raw, f"profile file {_shown(path)}")
        if path.parent.resolve() == PROFILE_DIR.resolve() and model.name != path.stem:
            raise ProfileError(f"{_shown(path)}: name {model.name!r} does not match the file name {path.stem!r}")
        hit = _CACHE[str(path.resolve())] = (_stamps(chain), model, raw)
    return hit[1], json.loads(json.dumps(hit[2]))


def load_profile_model(name_or_path: str | Path) -> Profile:
    """The typed profile of a name (experiments/profiles/<name>.yaml) or of a .yaml path."""
    return _load(name_or_path)[0]


def bench_settings(name_or_path: str | Path, section: str) -> dict[str, Any]:
    """A benchmark's ``section`` of a profile (a name, or a path to a profile .yaml file), as a dict; a profile
    without that section exits, naming the profiles that have one."""
    found = getattr(load_profile_model(name_or_path), section)
    if found is None:
        raise SystemExit(f"profile {str(name_or_path)!r} has no {section}: section (experiments/profiles/); profiles "
                         "with one: " + ", ".join(p for p in available_profiles()
                                                  if getattr(load_profile_model(p), section) is not None))
    return json.loads(found.model_dump_json())


def load_profile(name_or_path: str | Path) -> dict[str, Any]:
    """The profile as a plain dict (a fresh copy), after the model has validated it."""
    return _load(name_or_path)[1]


# -- this machine against a profile -----------------------------------------------------------------------------
def missing_hardware(profile: Mapping[str, Any], machine: dict[str, Any] | None = None) -> list[str]:
    """What this machine lacks to serve ``profile``; empty when it can."""
    machine = machine or hardware()
    need, missing = profile["hardware"], []
    gpus = machine["gpus"]["devices"]
    if need.get("gpus", 0) > len(gpus):
        have = f"{len(gpus)} ({gpus[0]['name']})" if gpus else "none"
        missing.append(f"{need['gpus']} GPU(s) (detected: {have})")
    model = need.get("gpu_model")
    if model and gpus and not all(model.lower() in g["name"].lower() for g in gpus[: need["gpus"]]):
        missing.append(f"GPU model {model} (detected: {gpus[0]['name']})")
    min_mem = need.get("min_gpu_memory_gb")
    if min_mem and gpus and min(g["memory_gb"] for g in gpus) < min_mem:
        missing.append(f"{min_mem} GB per GPU (detected: {min(g['memory_gb'] for g in gpus)} GB)")
    cores = machine["cpu"]["usable_cores"]
    if need.get("min_cpu_cores", 1) > cores:
        missing.append(f"{need['min_cpu_cores']} CPU cores (detected: {cores})")
    mem = machine["cpu"]["memory_gb"]
    if need.get("min_memory_gb", 0) > mem > 0:
        missing.append(f"{need['min_memory_gb']} GB of host memory (detected: {mem} GB)")
    return missing


def missing_paths(profile: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """Checkpoints (and the NeMo-RL checkout for the nemo-rl engine) that are not on local disk."""
    missing = []
    ckpts = profile.get("checkpoints") or {}
    root = config.get("checkpoint_root") or ""
    if ckpts and not root:
        missing.append(f"checkpoint_root (set --config checkpoint_root=/path holding {', '.join(ckpts.values())})")
    elif ckpts:
        for key, rel in ckpts.items():
            path = Path(root) / rel
            if not path.is_dir():
                missing.append(f"checkpoint {key}: {path} does not exist")
    if profile.get("engine") == "nemo-rl":
        nemo = config.get("nemo_rl_dir") or ""
        if not nemo:
            missing.append("nemo_rl_dir (set --config nemo_rl_dir=/path/to/your/NeMo-RL/checkout)")
        elif not (Path(nemo) / "nemo_rl").is_dir():
            missing.append(f"NeMo-RL checkout: {nemo} has no nemo_rl/ package")
    return missing


def check_servable(profile: Mapping[str, Any], config: Mapping[str, Any], *, jobs_run_here: bool = True) -> None:
    """Raise one ProfileError listing everything this machine lacks to serve ``profile``.

    With ``jobs_run_here=False`` (a cluster executor: jobs run on compute nodes, not on this login
    node) only the local paths are checked; the scheduler places the GPUs.
    """
    missing = (missing_hardware(profile) if jobs_run_here else []) + missing_paths(profile, config)
    if missing:
        raise ProfileError(f"profile {profile['name']!r} cannot run on this machine "
                           f"({hardware()['tag']}): missing " + "; ".join(missing))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Validate a hardware profile (experiments/profiles/<name>.yaml) "
                                             "and check that this machine can serve it.")
    ap.add_argument("profile", nargs="?", help="profile name, or a path to a profile .yaml file")
    ap.add_argument("--list", action="store_true", help="list the profiles")
    ap.add_argument("--schema", action="store_true", help="print the profile model as JSON schema")
    args = ap.parse_args(argv)
    if args.schema:
        print(json.dumps(Profile.model_json_schema(), indent=1))
        return 0
    if args.list or not args.profile:
        print("\n".join(available_profiles()))
        return 0
    try:
        check_servable(load_profile(args.profile), {})
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"profile {args.profile}: valid, and this machine ({hardware()['tag']}) can serve it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
