"""Validate configs with NeMo-RL's own loader and MasterConfig, inside a NeMo-RL checkout's environment.

Runs in NeMo-RL's environment, never in the suite's: standard library plus what NeMo-RL itself
imports (omegaconf, pydantic, nemo_rl). integrations.nemo_rl.upstream starts it with the checkout's
``uv run`` and reads the one JSON line it prints. For each config it does what NeMo-RL's entry
scripts do (register the OmegaConf resolvers, ``load_config``, ``OmegaConf.to_container(resolve=True)``,
``MasterConfig(**cfg)``) and then a strict check NeMo-RL does not do: every key of ``policy.draft``
must be a key of the checkout's DraftConfig (pydantic drops unknown TypedDict keys silently).

    cd /path/to/RL && uv run python $SUITE/integrations/nemo_rl/upstream_check.py validate run/nemo_rl_config.yaml
    cd /path/to/RL && uv run python $SUITE/integrations/nemo_rl/upstream_check.py schema   # record fixtures
    cd /path/to/RL && uv run python $SUITE/integrations/nemo_rl/upstream_check.py resolve examples/x.yaml

($SUITE: this suite's checkout.)
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

# Run as a script, this file's folder heads sys.path; NeMo-RL's imports must not see the suite's modules.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.getcwd())

MASTER_MODULE = "nemo_rl.algorithms.grpo"      # the MasterConfig both GRPO entry scripts use
DRAFT_MODULE = "nemo_rl.models.policy"


def _resolved(path: str) -> dict[str, Any]:
    from nemo_rl.utils.config import load_config, register_omegaconf_resolvers
    from omegaconf import OmegaConf
    register_omegaconf_resolvers()
    return OmegaConf.to_container(load_config(path), resolve=True)


def _draft_keys() -> set[str] | None:
    """Every key DraftConfig (and the disabled form, where the checkout has one) declares; None without one."""
    import importlib
    module = importlib.import_module(DRAFT_MODULE)
    keys: set[str] = set()
    for name in ("DraftConfig", "DraftConfigDisabled"):
        cls = getattr(module, name, None)
        if cls is not None:
            keys |= set(getattr(cls, "__required_keys__", set())) | set(getattr(cls, "__optional_keys__", set()))
    return keys or None


def _path(loc: tuple, data: Any) -> tuple[str, str]:
    """A pydantic error location as the config's key path; union branch tags (class names that are not
    keys of the data) are given apart: ('policy.megatron_cfg.moe_per_layer_logging', 'MegatronConfig')."""
    keys, tags, node = [], [], data
    for part in loc:
        if isinstance(node, dict) and part in node or isinstance(node, list) and isinstance(part, int):
            keys.append(str(part))
            node = node[part]
        elif isinstance(part, str) and part[:1].isupper():
            tags.append(part)
        else:
            keys.append(str(part))
            node = None
    return ".".join(keys), ".".join(tags)


def master_errors(cfg: dict[str, Any]) -> list[dict[str, str]]:
    import importlib
    master = importlib.import_module(MASTER_MODULE).MasterConfig
    try:
        master(**cfg)
    except Exception as exc:  # noqa: BLE001  (pydantic's ValidationError, or whatever NeMo-RL's validators raise)
        if not hasattr(exc, "errors"):
            return [{"key": "", "error": f"{type(exc).__name__}: {exc}", "branch": ""}]
        out = []
        for err in exc.errors():
            key, branch = _path(tuple(err.get("loc", ())), cfg)
            out.append({"key": key, "error": str(err.get("msg", err)), "branch": branch})
        return out
    return []


def draft_errors(cfg: dict[str, Any]) -> list[dict[str, str]]:
    draft = (cfg.get("policy") or {}).get("draft")
    if not isinstance(draft, dict):
        return []
    known = _draft_keys()
    if known is None:
        return [{"key": "policy.draft", "error": f"{DRAFT_MODULE} has no DraftConfig: the draft block is "
                 "never read by this checkout", "branch": ""}]
    return [{"key": f"policy.draft.{k}", "error": "not a key of the checkout's DraftConfig "
             f"({', '.join(sorted(known))}); NeMo-RL would keep it and never read it", "branch": ""}
            for k in sorted(set(draft) - known)]


def validate(path: str) -> dict[str, Any]:
    try:
        cfg = _resolved(path)
    except Exception as exc:  # noqa: BLE001  (a broken YAML or interpolation is an answer, not a crash)
        return {"config": path, "ok": False, "errors": [{"key": "", "error": f"load_config: {exc}", "branch": ""}]}
    errors = master_errors(cfg) + draft_errors(cfg)
    return {"config": path, "ok": not errors, "errors": errors}


def schema() -> dict[str, Any]:
    """MasterConfig's JSON schema (fields pydantic cannot express become open) and DraftConfig's keys."""
    import importlib

    from pydantic.json_schema import GenerateJsonSchema

    class OpenWhereInexpressible(GenerateJsonSchema):
        def handle_invalid_for_json_schema(self, schema, error_info):
            return {}

    master = importlib.import_module(MASTER_MODULE).MasterConfig
    return {"master_config": master.model_json_schema(schema_generator=OpenWhereInexpressible),
            "draft_keys": sorted(_draft_keys() or [])}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("validate", "schema", "resolve") or (argv[0] != "schema" and len(argv) < 2):
        print("usage: upstream_check.py validate CONFIG... | schema | resolve CONFIG", file=sys.stderr)
        return 2
    if argv[0] == "validate":
        out: Any = [validate(p) for p in argv[1:]]
    elif argv[0] == "schema":
        out = schema()
    else:
        out = _resolved(argv[1])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
