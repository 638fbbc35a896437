"""The paper's rows as NeMo-RL runs: a profile's artifact sections and ``nemo_rl:`` section, validated.

A paper profile (experiments/profiles/paper-*.yaml) lists each artifact's rows in the section every
engine reads (``table1: {steps, skip_steps, rows: label -> {policy, draft, baseline}}``); its
``nemo_rl:`` section says how a row becomes a NeMo-RL run: the policies' checkpoints and training and
rollout layouts, the draft families' settings, the draft checkpoints, the workloads. This module only
reads and checks that data into RowSpecs; config.py turns a RowSpec into a NeMo-RL config.

    python -m integrations.nemo_rl.rows paper-h100          # print every row of a profile
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any

from repro.core.profile import ProfileError, load_profile

ARTIFACTS = ("table1", "table2", "fig3", "fig4")
PAPER_LAYOUT = "paper"
# The layout NeMo-RL's co-training stack (PR 3713 head: PRs 3699/3712/3713 on main) runs today: no
# pipeline or context parallelism for the drafts (PRs 4059/4060 are not public) and no sequence
# packing (lm_policy.py refuses it with a draft). Not the paper's layout: its runs are labelled so.
UPSTREAM_LAYOUT = "upstream-today"
LAYOUTS = (PAPER_LAYOUT, UPSTREAM_LAYOUT)
BASELINE = "no draft"
FAMILY_METHODS = {"eagle3", "dflash", "dspark"}


class RowError(ValueError):
    """A row that does not exist, or profile sections (artifact rows, ``nemo_rl:``) that do not hold together."""


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
    # merged last into the generated config: keys NeMo-RL's MasterConfig requires that the example lacks
    overrides: dict[str, Any] = field(default_factory=dict)


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
    layout_name: str = PAPER_LAYOUT
    sequence_packing: bool = True   # the paper trains on packed sequences

    @property
    def is_baseline(self) -> bool:
        return self.family is None

    @property
    def is_paper_layout(self) -> bool:
        return self.layout_name == PAPER_LAYOUT


def with_layout(spec: RowSpec, name: str) -> RowSpec:
    """The row in layout ``name``: ``paper`` as the profile says, or ``upstream-today`` (PP = CP = 1,
    packing off, TP/EP and the GPU count kept: data parallelism takes the freed GPUs)."""
    if name not in LAYOUTS:
        raise RowError(f"layout {name!r}; expected one of {', '.join(LAYOUTS)}")
    if name == PAPER_LAYOUT:
        return spec
    return dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, pp=1, cp=1), layout_name=name,
                               sequence_packing=False)


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


def _family(key: str, spec: Any, where: str) -> Family:
    if not isinstance(spec, dict):
        raise RowError(f"{where}: expected a mapping of draft settings, got {spec!r}")
    method = _need(spec, "method", where, str)
    if method not in FAMILY_METHODS:
        raise RowError(f"{where}.method: {method!r}; expected one of {sorted(FAMILY_METHODS)}")
    if method == "eagle3":
        _positive(spec, "num_speculative_tokens", where)
    return Family(name=str(spec.get("name", key)), method=method,
                  settings={k: v for k, v in spec.items() if k not in ("method", "name")})


# Workload keys: single-turn sets come from NeMo-RL's named datasets, multi-turn (NeMo Gym) from JSONL files.
_DATASET_KEYS = {"train_dataset": str, "validation_dataset": str, "math_verify_impl": str,
                 "max_input_tokens": int, "max_response_tokens": int}
_GYM_KEYS = {"train_file": str, "validation_file": str, "tool_parser": str, "max_total_tokens": int}


def _workload(name: str, spec: Any, where: str) -> Workload:
    keys = _GYM_KEYS if isinstance(spec, dict) and "train_file" in spec else _DATASET_KEYS
    for key, kind in keys.items():
        if kind is int:
            _positive(spec, key, where)
        else:
            _need(spec, key, where, kind)
    overrides = spec.get("config_overrides") or {}
    if not isinstance(overrides, dict):
        raise RowError(f"{where}.config_overrides: {overrides!r} is not a mapping of NeMo-RL config keys")
    return Workload(name=name, example=_need(spec, "example", where, str), entry=_need(spec, "entry", where, str),
                    settings={k: v for k, v in spec.items() if k not in ("example", "entry", "config_overrides")},
                    overrides=overrides)


def section(profile: dict[str, Any]) -> dict[str, Any]:
    """The profile's ``nemo_rl:`` section; a clear error for profiles that have none."""
    sec = profile.get("nemo_rl")
    if not isinstance(sec, dict):
        raise RowError(f"profile {profile['name']!r} has no nemo_rl: section (engine {profile.get('engine')!r}); "
                       "the NeMo-RL rows live in experiments/profiles/paper-h100.yaml and paper-gb200.yaml")
    return sec


def load_rows(profile: dict[str, Any]) -> dict[str, dict[str, RowSpec]]:
    """artifact -> row -> RowSpec for every row of the profile's artifact sections, each checked."""
    name, sec = profile["name"], section(profile)
    where = f"profile {name}: nemo_rl"
    gpus_per_node = _positive(sec, "gpus_per_node", where)
    grpo = _need(sec, "grpo", where, dict)
    for key in ("num_prompts_per_step", "num_generations_per_prompt", "train_global_batch_size"):
        _positive(grpo, key, f"{where}.grpo")
    settings = _need(sec, "artifacts", where, dict)
    models, families = _need(sec, "models", where, dict), _need(sec, "drafts", where, dict)
    workloads, draft_ckpts = _need(sec, "workloads", where, dict), sec.get("draft_checkpoints") or {}
    ckpts = profile.get("checkpoints") or {}
    layouts = {m: _layout(spec, gpus_per_node, f"{where}.models.{m}") for m, spec in models.items()}
    fams = {f: _family(f, spec, f"{where}.drafts.{f}") for f, spec in families.items()}
    loads = {w: _workload(w, spec, f"{where}.workloads.{w}") for w, spec in workloads.items()}
    out: dict[str, dict[str, RowSpec]] = {}
    for artifact in ARTIFACTS:
        art = profile.get(artifact)
        if art is None:
            continue
        aw = f"profile {name}: {artifact}"
        rows, steps = _need(art, "rows", aw, dict), _positive(art, "steps", aw)
        run = _need(settings, artifact, f"{where}.artifacts", dict)
        sw = f"{where}.artifacts.{artifact}"
        val_period, save = _need(run, "val_period", sw, int), _need(run, "checkpointing", sw, bool)
        if val_period < 0 or (save and val_period == 0):
            raise RowError(f"{sw}: val_period {val_period} must be >= 0, and > 0 when checkpointing (NeMo-RL "
                           "keeps the best checkpoints by validation accuracy)")
        workload = (art.get("workload") or {}).get("name", "math")
        if workload not in loads:
            raise RowError(f"{aw}.workload.name: {workload!r} is not in nemo_rl.workloads ({', '.join(loads)})")
        out[artifact] = {}
        for row, spec in rows.items():
            w = f"{aw}.rows.{row!r}"
            model = _need(spec, "policy", w, str)
            if model not in models:
                raise RowError(f"{w}: policy {model!r} is not in nemo_rl.models ({', '.join(models)})")
            ckpt = _need(models[model], "checkpoint", f"{where}.models.{model}", str)
            if ckpt not in ckpts:
                raise RowError(f"{where}.models.{model}.checkpoint: {ckpt!r} is not a key of checkpoints:")
            family = draft_ckpt = block = None
            if spec.get("draft"):
                if spec["draft"] not in fams:
                    raise RowError(f"{w}: draft {spec['draft']!r} is not in nemo_rl.drafts ({', '.join(fams)})")
                family = fams[spec["draft"]]
                dkey = f"{model}/{spec['draft']}"
                if dkey not in draft_ckpts:
                    raise RowError(f"{w}: no draft checkpoint for {dkey!r} in nemo_rl.draft_checkpoints")
                dw = f"{where}.draft_checkpoints.{dkey}"
                draft_ckpt = _need(draft_ckpts[dkey], "checkpoint", dw, str)
                if draft_ckpt not in ckpts:
                    raise RowError(f"{dw}.checkpoint: {draft_ckpt!r} is not a key of checkpoints:")
                if family.method in ("dflash", "dspark"):
                    block = _positive(draft_ckpts[dkey], "block_size", dw)
                    if family.method == "dflash" and block < 2:
                        raise RowError(f"{dw}.block_size: {block}; DFlash needs >= 2 (an anchor and at least "
                                       "one proposed token)")
            out[artifact][row] = RowSpec(
                profile=name, artifact=artifact, row=row, model=model, model_checkpoint=ckpt,
                layout=layouts[model], workload=loads[workload], grpo=dict(grpo), max_num_steps=steps,
                val_period=val_period, checkpointing=save, family=family, draft_checkpoint=draft_ckpt,
                block_size=block, baseline_row=spec.get("baseline"), checkpoints=dict(ckpts))
        _check_baselines(out[artifact], aw)
    if not out:
        raise RowError(f"profile {name!r} has no artifact sections ({', '.join(ARTIFACTS)}) with rows")
    return out


def _check_baselines(rows: dict[str, RowSpec], where: str) -> None:
    """Each draft row names its no-draft row: a row of the same artifact, without a draft, same policy."""
    for name, spec in rows.items():
        if spec.is_baseline:
            if spec.baseline_row is not None:
                raise RowError(f"{where}.rows.{name!r}: a no-draft row has no baseline (got {spec.baseline_row!r})")
            continue
        base = rows.get(spec.baseline_row) if spec.baseline_row else None
        if base is None or not base.is_baseline or base.model != spec.model:
            raise RowError(f"{where}.rows.{name!r}: baseline {spec.baseline_row!r} must name a row of {where} "
                           f"without a draft and with policy {spec.model!r}; rows: {', '.join(map(repr, rows))}")


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
        print("usage: python -m integrations.nemo_rl.rows PROFILE", file=sys.stderr)
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
