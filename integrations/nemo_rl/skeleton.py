"""Key/type skeleton of NeMo-RL's example configs, and the check of a generated config against it.

A skeleton maps every key path of an example config (its ``defaults:`` chain merged, as NeMo-RL's
``load_config`` does) to the type of its value: int, float, str, bool, null, list, dict (an empty
mapping: open), or interp (an OmegaConf ``${...}`` interpolation: any type). It also records the
keys and types of NeMo-RL's ``DraftConfig`` TypedDict (the draft co-training stack adds keys there
that no example sets). The suite's generated configs are checked against a recorded skeleton in CI,
where NeMo-RL is not installed (tests/integrations/nemo_rl/fixtures/nemo_rl_skeleton.json).

    # record from a NeMo-RL checkout (the fixture notes the commit)
    python -m integrations.nemo_rl.skeleton record --nemo-rl-dir /path/to/RL --commit <sha> --note "<what>" \
        --out tests/integrations/nemo_rl/fixtures/nemo_rl_skeleton.json
"""
from __future__ import annotations

import argparse
import ast
import inspect
import sys
from pathlib import Path
from typing import Any

import yaml

from repro.core.io import write_json_atomic

# The example configs the generated configs inherit from (the workloads') or follow (the online
# EAGLE-3 recipe, the one example with a draft and vLLM speculative config); paths in a NeMo-RL checkout.
EAGLE3_RECIPE = "examples/configs/recipes/llm/grpo-qwen3-1.7b-1n8g-megatron-eagle3.yaml"
EXAMPLES = (
    "examples/configs/grpo_math_8B_megatron.yaml",
    "examples/nemo_gym/grpo_workplace_assistant_nemotron_nano_v2_9b.yaml",
    EAGLE3_RECIPE,
)
POLICY_INIT = "nemo_rl/models/policy/__init__.py"
DRAFT_PATH = "policy.draft"
WANDB_PATH = "logger.wandb"   # NeMo-RL's WandbLogger passes this mapping to wandb.init(**cfg)


class SkeletonError(ValueError):
    """A generated config with a key NeMo-RL does not know or a value of the wrong type."""


# -- loading NeMo-RL YAML with its inheritance --------------------------------------------------------
def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """OmegaConf-style merge: mappings merge key by key, anything else replaces; ``_override_: true``
    in a mapping replaces the base mapping instead (NeMo-RL's marker)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and value.get("_override_"):
            out[key] = {k: v for k, v in value.items() if k != "_override_"}
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def load_with_defaults(path: Path) -> dict[str, Any]:
    """A NeMo-RL config file with its ``defaults:`` chain merged (relative to the file's folder)."""
    cfg = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(cfg, dict):
        raise SkeletonError(f"{path}: expected a mapping at the top level")
    defaults = cfg.pop("defaults", None)
    if defaults is None:
        return cfg
    base: dict[str, Any] = {}
    for parent in [defaults] if isinstance(defaults, str) else list(defaults):
        parent_path = Path(parent) if str(parent).startswith("/") else Path(path).parent / str(parent)
        base = merge(base, load_with_defaults(parent_path))
    return merge(base, cfg)


# -- skeletons ------------------------------------------------------------------------------------------
def type_tag(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "interp" if "${" in value else "str"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "dict"
    raise SkeletonError(f"value {value!r} of type {type(value).__name__} is not YAML data")


def flatten(cfg: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """key path -> leaf value; empty mappings are leaves."""
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def skeleton_of(cfg: dict[str, Any]) -> dict[str, str]:
    return {path: type_tag(v) for path, v in sorted(flatten(cfg).items())}


_ANNOTATION_TAGS = {"int": "int", "float": "float", "str": "str", "bool": "bool", "None": "null",
                    "list": "list", "dict": "dict", "Any": "any"}


def _annotation_tags(node: ast.expr) -> set[str]:
    """Type tags an annotation allows: NotRequired[int | None] -> {int, null}; Literal[True] -> {bool}."""
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value)
        if head in ("NotRequired", "Required", "Optional"):
            return _annotation_tags(node.slice) | ({"null"} if head == "Optional" else set())
        if head == "Literal":
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return {type_tag(ast.literal_eval(e)) for e in elts}
        return _annotation_tags(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _annotation_tags(node.left) | _annotation_tags(node.right)
    if isinstance(node, ast.Constant) and node.value is None:
        return {"null"}
    name = ast.unparse(node)
    return {_ANNOTATION_TAGS.get(name, "any")}


def typed_dict_keys(source: str, class_name: str) -> dict[str, list[str]]:
    """Keys of a TypedDict class in Python source, each with the type tags its annotation allows."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return {stmt.target.id: sorted(_annotation_tags(stmt.annotation)) for stmt in node.body
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)}
    raise SkeletonError(f"class {class_name} not found")


def record(nemo_rl_dir: Path, commit: str, note: str = "", examples: tuple[str, ...] = EXAMPLES) -> dict[str, Any]:
    """The skeleton of ``examples`` and of DraftConfig in a NeMo-RL checkout."""
    nemo_rl_dir = Path(nemo_rl_dir)
    missing = [p for p in (*examples, POLICY_INIT) if not (nemo_rl_dir / p).is_file()]
    if missing:
        raise SkeletonError(f"{nemo_rl_dir} is not a NeMo-RL checkout with the files recorded here: "
                            f"missing {', '.join(missing)}")
    return {
        "nemo_rl_commit": commit,
        "note": note,
        "recorded_with": "python -m integrations.nemo_rl.skeleton record",
        "examples": {ex: skeleton_of(load_with_defaults(nemo_rl_dir / ex)) for ex in examples},
        "typed_dicts": {DRAFT_PATH: typed_dict_keys((nemo_rl_dir / POLICY_INIT).read_text(), "DraftConfig")},
    }


# -- checking -------------------------------------------------------------------------------------------
def _compatible(have: str, allowed: set[str]) -> bool:
    if allowed & {"any", "interp"} or have in allowed:
        return True
    return have == "int" and "float" in allowed


def _wandb_init_kwargs() -> set[str]:
    import wandb
    return set(inspect.signature(wandb.init).parameters)


def check(generated: dict[str, Any], skeleton: dict[str, Any], examples: list[str]) -> None:
    """Raise SkeletonError listing every key of ``generated`` (the suite's overrides, ``defaults:``
    removed) that NeMo-RL's ``examples`` and DraftConfig do not know, or whose value has another type."""
    known: dict[str, set[str]] = {}
    for ex in examples:
        if ex not in skeleton["examples"]:
            raise SkeletonError(f"example {ex!r} is not in the recorded skeleton "
                                f"(recorded: {', '.join(skeleton['examples'])})")
        for path, tag in skeleton["examples"][ex].items():
            known.setdefault(path, set()).add(tag)
    draft = {k: set(v) for k, v in skeleton["typed_dicts"][DRAFT_PATH].items()}
    wandb_kwargs: set[str] | None = None
    errors = []
    for path, value in flatten({k: v for k, v in generated.items() if k != "defaults"}).items():
        have = type_tag(value)
        if path.startswith(DRAFT_PATH + "."):
            key = path[len(DRAFT_PATH) + 1:]
            if key not in draft:
                errors.append(f"{path}: not a key of NeMo-RL's DraftConfig ({', '.join(sorted(draft))})")
            elif not _compatible(have, draft[key]):
                errors.append(f"{path}: {value!r} is {have}; DraftConfig declares {'/'.join(sorted(draft[key]))}")
            continue
        if path.startswith(WANDB_PATH + ".") and path not in known:
            wandb_kwargs = _wandb_init_kwargs() if wandb_kwargs is None else wandb_kwargs
            key = path[len(WANDB_PATH) + 1:].split(".")[0]
            if key not in wandb_kwargs:
                errors.append(f"{path}: not a wandb.init argument (NeMo-RL passes {WANDB_PATH} to wandb.init)")
            continue
        if path in known:
            # null switches a key off (NeMo-RL's own examples null out whole sections); an example's
            # null means "unset", so any type may fill it; otherwise the types must agree.
            allowed = known[path]
            ok = have == "null" or allowed == {"null"} or _compatible(have, allowed - {"null"})
            if not ok:
                errors.append(f"{path}: {value!r} is {have}; NeMo-RL's examples have {'/'.join(sorted(allowed))}")
            continue
        # Under an open mapping (an empty dict or a null in the example, e.g. vllm_kwargs: {} or
        # data.validation: null) any key is allowed.
        parents = [path.rsplit(".", n)[0] for n in range(1, path.count(".") + 1)]
        if any(known.get(p, set()) and known[p] <= {"dict", "null"} for p in parents):
            continue
        if any(p in known for p in parents):
            errors.append(f"{path}: its parent holds a {known[next(p for p in parents if p in known)]} value "
                          "in NeMo-RL's examples, not a mapping")
            continue
        errors.append(f"{path}: no such key in NeMo-RL's {', '.join(examples)}")
    if errors:
        raise SkeletonError(f"generated config does not match NeMo-RL @ {skeleton['nemo_rl_commit'][:12]}: "
                            + "; ".join(errors))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="record the skeleton of a NeMo-RL checkout")
    rec.add_argument("--nemo-rl-dir", type=Path, required=True)
    rec.add_argument("--commit", required=True, help="the checkout's commit, written into the skeleton")
    rec.add_argument("--note", default="", help="what the commit is (branch, PRs), written into the skeleton")
    rec.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        data = record(args.nemo_rl_dir, args.commit, args.note)
    except (SkeletonError, OSError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_json_atomic(args.out, data)
    print(f"skeleton of NeMo-RL @ {args.commit[:12]}: "
          + ", ".join(f"{ex} ({len(s)} keys)" for ex, s in data["examples"].items()) + f" -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
