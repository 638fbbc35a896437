"""The paper's rows as NeMo-RL runs: a profile's ``nemo_rl:`` section, validated into RowSpecs.

A profile (experiments/profiles/paper-*.yaml) lists, per artifact, each paper row with its target
model, draft family (null for the no-draft baseline) and workload; the models carry their training
and rollout layouts, the families their draft settings, the drafts their checkpoints. This module
only reads and checks that data; config.py turns a RowSpec into a NeMo-RL config.

    python -m repro.nemo_rl.rows paper-h100          # print every row of a profile
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Any

from repro.report.profiles import ProfileError, load_profile

ARTIFACTS = ("table1", "table2", "fig3", "fig4")
BASELINE = "no draft"
FAMILY_METHODS = {"eagle3", "dflash", "dspark"}


class RowError(ValueError):
    """A row that does not exist, or a profile ``nemo_rl:`` section that does not hold together."""


@dataclass(frozen=True)
class Layout:
    """Training layout (Megatron TP/PP/CP/EP) and rollout layout (vLLM TP/EP) on nodes x gpus_per_node."""
    tp: int
    pp: int
    cp: int
    ep: int
    vllm_tp: int
    vllm_ep: int
    nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)


@dataclass(frozen=True)
class Family:
    name: str                       # the paper's name: EAGLE-3, DFlash, DSpark
    method: str                     # NeMo-RL policy.draft.method and vLLM speculative method
    settings: dict[str, Any]        # the other policy.draft keys (loss_weight, ttt_steps, ...)


@dataclass(frozen=True)
class Workload:
    name: str
    example: str                    # NeMo-RL example config the run inherits from (path in the checkout)
    entry: str                      # NeMo-RL entry script (path in the checkout)
    settings: dict[str, Any]


@dataclass(frozen=True)
class RowSpec:
    profile: str
    artifact: str
    row: str
    model: str
    model_checkpoint: str           # key of the profile's checkpoints: map
    layout: Layout
    workload: Workload
    grpo: dict[str, int]
    max_num_steps: int
    val_period: int                 # 0: no validation
    checkpointing: bool
    family: Family | None = None
    draft_checkpoint: str | None = None
    block_size: int | None = None
    baseline_row: str | None = None  # the matching no-draft row (None for a baseline)
    checkpoints: dict[str, str] = field(default_factory=dict)

    @property
    def is_baseline(self) -> bool:
        return self.family is None


def _need(mapping: Any, key: str, where: str, kind: type | tuple = object) -> Any:
    if not isinstance(mapping, dict) or key not in mapping:
        raise RowError(f"{where}: missing key {key!r}")
    value = mapping[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise RowError(f"{where}.{key}: {value!r} is not a {getattr(kind, '__name__', kind)}")
    return value


def _positive(mapping: dict, key: str, where: str) -> int:
    value = _need(mapping, key, where, int)
    if value < 1:
        raise RowError(f"{where}.{key}: {value} must be >= 1")
    return value


def _layout(model: dict, gpus_per_node: int, where: str) -> Layout:
    par, vllm = _need(model, "parallel", where, dict), _need(model, "vllm", where, dict)
    layout = Layout(tp=_positive(par, "tp", f"{where}.parallel"), pp=_positive(par, "pp", f"{where}.parallel"),
                    cp=_positive(par, "cp", f"{where}.parallel"), ep=_positive(par, "ep", f"{where}.parallel"),
                    vllm_tp=_positive(vllm, "tp", f"{where}.vllm"), vllm_ep=_positive(vllm, "ep", f"{where}.vllm"),
                    nodes=_positive(model, "nodes", where), gpus_per_node=gpus_per_node)
    model_parallel = layout.tp * layout.pp * layout.cp
    if layout.gpus % model_parallel:
        raise RowError(f"{where}: TP x PP x CP = {layout.tp}x{layout.pp}x{layout.cp} = {model_parallel} does "
                       f"not divide the {layout.gpus} GPUs ({layout.nodes} node(s) x {gpus_per_node})")
    if (layout.gpus // layout.pp) % layout.ep:
        raise RowError(f"{where}: EP = {layout.ep} does not divide the {layout.gpus // layout.pp} GPUs of a "
                       f"pipeline stage (GPUs / PP = {layout.gpus}/{layout.pp}); Megatron carves experts out of them")
    if layout.vllm_ep > 1 and layout.vllm_ep % layout.vllm_tp:
        raise RowError(f"{where}.vllm: EP = {layout.vllm_ep} is not a multiple of TP = {layout.vllm_tp} "
                       "(vLLM's EP = DP x TP)")
    if layout.gpus % layout.vllm_tp or layout.vllm_ep > layout.gpus:
        raise RowError(f"{where}.vllm: TP = {layout.vllm_tp}, EP = {layout.vllm_ep} do not fit {layout.gpus} GPUs")
    return layout


def _family(name: str, spec: Any, where: str) -> Family:
    if not isinstance(spec, dict):
        raise RowError(f"{where}: expected a mapping of draft settings, got {spec!r}")
    method = _need(spec, "method", where, str)
    if method not in FAMILY_METHODS:
        raise RowError(f"{where}.method: {method!r}; expected one of {sorted(FAMILY_METHODS)}")
    if method == "eagle3":
        _positive(spec, "num_speculative_tokens", where)
    return Family(name=name, method=method, settings={k: v for k, v in spec.items() if k != "method"})


def section(profile: dict[str, Any]) -> dict[str, Any]:
    """The profile's ``nemo_rl:`` section; a clear error for profiles that have none."""
    sec = profile.get("nemo_rl")
    if not isinstance(sec, dict):
        raise RowError(f"profile {profile['name']!r} has no nemo_rl: section (engine {profile.get('engine')!r}); "
                       "the NeMo-RL rows live in experiments/profiles/paper-h100.yaml and paper-gb200.yaml")
    return sec


def load_rows(profile: dict[str, Any]) -> dict[str, dict[str, RowSpec]]:
    """artifact -> row -> RowSpec for every row of the profile, each checked."""
    name, sec = profile["name"], section(profile)
    where = f"profile {name}: nemo_rl"
    gpus_per_node = _positive(sec, "gpus_per_node", where)
    grpo = _need(sec, "grpo", where, dict)
    for key in ("num_prompts_per_step", "num_generations_per_prompt", "train_global_batch_size"):
        _positive(grpo, key, f"{where}.grpo")
    artifacts = _need(sec, "artifacts", where, dict)
    models, families = _need(sec, "models", where, dict), _need(sec, "families", where, dict)
    workloads, drafts = _need(sec, "workloads", where, dict), sec.get("drafts") or {}
    ckpts = profile.get("checkpoints") or {}
    layouts = {m: _layout(spec, gpus_per_node, f"{where}.models.{m}") for m, spec in models.items()}
    fams = {f: _family(f, spec, f"{where}.families.{f}") for f, spec in families.items()}
    loads = {}
    for w, spec in workloads.items():
        loads[w] = Workload(name=w, example=_need(spec, "example", f"{where}.workloads.{w}", str),
                            entry=_need(spec, "entry", f"{where}.workloads.{w}", str),
                            settings={k: v for k, v in spec.items() if k not in ("example", "entry")})
    rows_sec = _need(sec, "rows", where, dict)
    out: dict[str, dict[str, RowSpec]] = {}
    for artifact, rows in rows_sec.items():
        if artifact not in ARTIFACTS:
            raise RowError(f"{where}.rows: artifact {artifact!r}; expected one of {', '.join(ARTIFACTS)}")
        run = _need(artifacts, artifact, f"{where}.artifacts", dict)
        aw = f"{where}.artifacts.{artifact}"
        max_steps, val_period = _positive(run, "max_num_steps", aw), _need(run, "val_period", aw, int)
        save = _need(run, "checkpointing", aw, bool)
        if val_period < 0 or (save and val_period == 0):
            raise RowError(f"{aw}: val_period {val_period} must be >= 0, and > 0 when checkpointing (NeMo-RL "
                           "keeps the best checkpoints by validation accuracy)")
        out[artifact] = {}
        for row, spec in rows.items():
            w = f"{where}.rows.{artifact}.{row!r}"
            model = _need(spec, "model", w, str)
            if model not in models:
                raise RowError(f"{w}: model {model!r} is not in nemo_rl.models ({', '.join(models)})")
            ckpt = _need(models[model], "checkpoint", f"{where}.models.{model}", str)
            if ckpt not in ckpts:
                raise RowError(f"{where}.models.{model}.checkpoint: {ckpt!r} is not a key of checkpoints:")
            workload = _need(spec, "workload", w, str)
            if workload not in loads:
                raise RowError(f"{w}: workload {workload!r} is not in nemo_rl.workloads ({', '.join(loads)})")
            fam_name = spec.get("family")
            family = draft_ckpt = block = None
            if fam_name is not None:
                if fam_name not in fams:
                    raise RowError(f"{w}: family {fam_name!r} is not in nemo_rl.families ({', '.join(fams)})")
                family = fams[fam_name]
                dkey = f"{model}/{fam_name}"
                if dkey not in drafts:
                    raise RowError(f"{w}: no draft checkpoint for {dkey!r} in nemo_rl.drafts")
                draft_ckpt = _need(drafts[dkey], "checkpoint", f"{where}.drafts.{dkey}", str)
                if draft_ckpt not in ckpts:
                    raise RowError(f"{where}.drafts.{dkey}.checkpoint: {draft_ckpt!r} is not a key of checkpoints:")
                if family.method in ("dflash", "dspark"):
                    block = _positive(drafts[dkey], "block_size", f"{where}.drafts.{dkey}")
                    if family.method == "dflash" and block < 2:
                        raise RowError(f"{where}.drafts.{dkey}.block_size: {block}; DFlash needs >= 2 "
                                       "(an anchor and at least one proposed token)")
            out[artifact][row] = RowSpec(
                profile=name, artifact=artifact, row=row, model=model, model_checkpoint=ckpt,
                layout=layouts[model], workload=loads[workload], grpo=dict(grpo),
                max_num_steps=max_steps, val_period=val_period, checkpointing=save, family=family,
                draft_checkpoint=draft_ckpt, block_size=block, checkpoints=dict(ckpts))
        _attach_baselines(out[artifact], f"{where}.rows.{artifact}")
    return out


def _attach_baselines(rows: dict[str, RowSpec], where: str) -> None:
    """Each draft row's no-draft row: same model and workload, family null. One must exist."""
    for name, spec in list(rows.items()):
        if spec.is_baseline:
            continue
        matches = [r for r, s in rows.items()
                   if s.is_baseline and s.model == spec.model and s.workload.name == spec.workload.name]
        if len(matches) != 1:
            raise RowError(f"{where}: row {name!r} needs exactly one no-draft row (family: null) with model "
                           f"{spec.model!r} and workload {spec.workload.name!r}; found {matches or 'none'}")
        rows[name] = replace(spec, baseline_row=matches[0])


def resolve(profile_name: str, artifact: str, row: str) -> RowSpec:
    """One row of one artifact of a profile; errors name the bad value and list the valid ones."""
    try:
        profile = load_profile(profile_name)
    except ProfileError as exc:
        raise RowError(str(exc)) from exc
    if artifact not in ARTIFACTS:
        raise RowError(f"artifact {artifact!r}; expected one of {', '.join(ARTIFACTS)}")
    rows = load_rows(profile)
    if artifact not in rows:
        raise RowError(f"profile {profile_name!r} has no NeMo-RL rows for {artifact} "
                       f"(it has: {', '.join(rows) or 'none'})")
    if row not in rows[artifact]:
        raise RowError(f"{artifact} has no row {row!r} in profile {profile_name!r}; expected one of: "
                       + ", ".join(repr(r) for r in rows[artifact]))
    return rows[artifact][row]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m repro.nemo_rl.rows PROFILE", file=sys.stderr)
        return 2
    try:
        rows = load_rows(load_profile(args[0]))
    except (ProfileError, RowError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for artifact, specs in rows.items():
        for row, s in specs.items():
            lay = s.layout
            print(f"{artifact:7s} {row!r:44s} {s.model} {s.family.name if s.family else BASELINE} "
                  f"TP/PP/CP/EP={lay.tp}/{lay.pp}/{lay.cp}/{lay.ep} on {lay.gpus} GPUs, {s.workload.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
