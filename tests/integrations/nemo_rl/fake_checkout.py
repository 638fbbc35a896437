"""Test helpers: a stand-in NeMo-RL checkout rebuilt from a recorded NeMo-RL commit, and the local files
(checkpoints, HF cache, Workplace Assistant JSONL) a paper profile names.

The stand-in holds what integrations.nemo_rl reads from a checkout: the example configs (the recorded resolved
examples, tests/integrations/nemo_rl/fixtures/nemo_rl-<commit>/recorded.json), DraftConfig as an importable TypedDict
with the recorded keys and types, ray.sub as an empty file, the draft modules, optionally carrying the
refusals NeMo-RL's co-training stack raises without PRs 4059/4060 (the texts checks.py looks for), an
examples/run_grpo.py that only logs to W&B as NeMo-RL does (FAKE_ENTRY), for launch tests, and a
stand-in of NeMo-RL's config API (load_config; MasterConfig replaying the recorded JSON schema and
raising pydantic's ValidationError as the real one does) that integrations/nemo_rl/upstream_check.py runs
under ``fake_uv``: a ``uv`` whose ``uv run CMD`` runs CMD with this venv's Python.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from integrations.nemo_rl import checks
from integrations.nemo_rl.skeleton import DRAFT_PATH, POLICY_INIT
from repro.core.provenance import REPO_ROOT

FIXTURES = Path(__file__).parent / "fixtures"
SKELETON = FIXTURES / "nemo_rl_skeleton.json"
RECORDED_MAIN = FIXTURES / "nemo_rl-7ea279a" / "recorded.json"      # NeMo-RL main
RECORDED_PR3713 = FIXTURES / "nemo_rl-2b69e2b" / "recorded.json"    # the co-training stack's head

# Stand-ins of NeMo-RL's config API, as upstream_check.py calls it.
FAKE_LOAD_CONFIG = """from integrations.nemo_rl.skeleton import load_with_defaults as load_config
def register_omegaconf_resolvers():
    pass
"""
FAKE_OMEGACONF = """class OmegaConf:
    @staticmethod
    def to_container(cfg, resolve=True):
        return cfg
"""
FAKE_GRPO = """import json
from pydantic import ValidationError
from pydantic_core import PydanticCustomError
from integrations.nemo_rl.upstream import schema_errors
SCHEMA = json.load(open(RECORDED))["master_config"]
class MasterConfig:
    def __init__(self, **cfg):
        errors = schema_errors(cfg, SCHEMA)
        if errors:
            lines = []
            for e in errors:
                keys = tuple(e["key"].split("."))
                loc = keys[:-1] + ((e["branch"],) if e["branch"] else ()) + keys[-1:]
                kind = "missing" if e["error"] == "Field required" else PydanticCustomError("schema", e["error"])
                lines.append({"type": kind, "loc": loc, "input": cfg})
            raise ValidationError.from_exception_data("MasterConfig", lines)
"""


def fake_uv(bin_dir: Path) -> Path:
    """A ``uv`` for tests: ``uv run CMD...`` runs CMD with this venv's Python and the suite importable."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "uv").write_text(f'#!/bin/bash\n[ "$1" = run ] || exit 64\nshift\n'
                                f'export PYTHONPATH={REPO_ROOT}${{PYTHONPATH:+:$PYTHONPATH}}\nexec "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    for name in ("uv", "python"):
        (bin_dir / name).chmod(0o755)
    return bin_dir
_VALUES = {"int": 1, "float": 0.5, "str": "x", "bool": False, "null": None, "list": [], "dict": {},
           "interp": "${policy.max_total_sequence_length}"}
_ANNOTATIONS = {"int": "int", "float": "float", "str": "str", "bool": "bool", "null": "None", "list": "list",
                "dict": "dict", "any": "Any"}


# Stand-in for NeMo-RL's entry script: logs two GRPO steps to W&B the way NeMo-RL's Logger does
# (wandb.init(**logger.wandb, dir=<log_dir>/exp_001/wandb), NeMo-RL's key names, one commit per step).
FAKE_ENTRY = """import argparse, os, sys
import wandb, yaml
ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True)
cfg = yaml.safe_load(open(ap.parse_args().config))
log_dir = os.path.join(cfg["logger"]["log_dir"], "exp_001", "wandb")
os.makedirs(log_dir, exist_ok=True)
run = wandb.init(**cfg["logger"]["wandb"], dir=log_dir,
                 settings=wandb.Settings(console="off", x_disable_stats=True, x_disable_meta=True))
samples = cfg["grpo"]["num_prompts_per_step"] * cfg["grpo"]["num_generations_per_prompt"]
drafted = cfg["policy"]["draft"]["enabled"]
for step in range(1, cfg["grpo"]["max_num_steps"] + 1):
    run.log({"train/reward": 0.1 * step, "train/mean_gen_tokens_per_sample": 100.0}, step=step)
    run.log({"train/gen_kl_error": 6e-4, "train/vllm/spec_num_drafts": 50.0 if drafted else 0.0,
             "train/vllm/spec_acceptance_length": 2.5 if drafted else 1.0}, step=step)
    step_s = 8.0 if drafted else 10.0
    run.log({"performance/samples_per_sec": samples / step_s}, step=step)
    run.log({"timing/train/generation": 4.0 if drafted else 6.0, "timing/train/policy_training": 3.0,
             "timing/train/total_step_time": step_s}, step=step, commit=True)
run.finish()
print("fake NeMo-RL: done", file=sys.stderr)
"""


def skeleton() -> dict:
    return json.loads(SKELETON.read_text())


def unflatten(flat: dict[str, object]) -> dict:
    out: dict = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def make_checkout(root: Path, *, refusals: tuple[str, ...] = (), missing: tuple[str, ...] = (),
                  drop_draft_keys: tuple[str, ...] = (), recorded: Path = RECORDED_PR3713) -> Path:
    """A stand-in checkout at ``root`` of the ``recorded`` NeMo-RL commit. ``refusals``: keys of
    checks.REFUSALS whose refusal text the draft code carries (a checkout without that PR); ``missing``:
    relative files to leave out; ``drop_draft_keys``: DraftConfig keys it lacks (an older stack)."""
    skel, rec = skeleton(), json.loads(Path(recorded).read_text())
    files: dict[str, str] = {example: yaml.safe_dump(cfg) for example, cfg in rec["examples"].items()}
    for example, keys in skel["examples"].items():
        files.setdefault(example, yaml.safe_dump(unflatten({k: _VALUES[t] for k, t in keys.items()})))
    tags = skel["typed_dicts"][DRAFT_PATH]
    fields = "\n".join(f"    {k}: NotRequired[{' | '.join(_ANNOTATIONS[t] for t in tags.get(k, ['any']))}]"
                       for k in rec["draft_keys"] if k not in drop_draft_keys)
    files[POLICY_INIT] = f"from typing import Any, NotRequired, TypedDict\nclass DraftConfig(TypedDict):\n{fields}\n"
    files["nemo_rl/utils/__init__.py"] = files["nemo_rl/algorithms/__init__.py"] = ""
    files["nemo_rl/models/__init__.py"] = ""
    files["nemo_rl/utils/config.py"] = FAKE_LOAD_CONFIG
    files["nemo_rl/algorithms/grpo.py"] = f"RECORDED = {str(recorded)!r}\n" + FAKE_GRPO
    files["omegaconf.py"] = FAKE_OMEGACONF
    files["examples/run_grpo.py"] = FAKE_ENTRY
    for rel in ("examples/nemo_gym/run_grpo_nemo_gym.py", "ray.sub",
                "nemo_rl/__init__.py", f"{checks.DRAFT_DIR}/dflash.py", f"{checks.DRAFT_DIR}/dspark.py",
                f"{checks.DRAFT_DIR}/utils.py", checks.LM_POLICY):
        files.setdefault(rel, "")
    for key in refusals:   # written as NeMo-RL writes them: one message split over two string literals
        rels, text, _ = checks.REFUSALS[key]
        rel = rels[0] if rels[0].endswith(".py") else f"{rels[0]}/utils.py"
        head, tail = text.rsplit(" ", 1)
        files[rel] += f'raise ValueError(\n    "... {head} "\n    "{tail} ..."\n)\n'
    for rel, text in files.items():
        if rel in missing:
            continue
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def make_data(root: Path, profile: dict, *, skip_checkpoints: tuple[str, ...] = (),
              block_sizes: dict[str, int] | None = None) -> dict[str, Path]:
    """Checkpoint folders (config.json with the profile's block sizes), an HF cache with the math
    datasets, and the Workplace Assistant JSONL. Returns the paths to pass to the CLI."""
    ckpt_root, hf, ds = root / "checkpoints", root / "hf", root / "datasets"
    sizes = {d["checkpoint"]: d.get("block_size") for d in profile["nemo_rl"].get("draft_checkpoints", {}).values()}
    sizes.update(block_sizes or {})
    for key, rel in profile["checkpoints"].items():
        if key in skip_checkpoints:
            continue
        (ckpt_root / rel).mkdir(parents=True, exist_ok=True)
        cfg = {"block_size": sizes[key]} if sizes.get(key) else {}
        (ckpt_root / rel / "config.json").write_text(json.dumps(cfg))
    for w in profile["nemo_rl"]["workloads"].values():
        for ds_id in w.get("hf_datasets", []):
            (hf / "hub" / ("datasets--" + ds_id.replace("/", "--"))).mkdir(parents=True, exist_ok=True)
        for key in ("train_file", "validation_file"):
            if key in w:
                (ds / w[key]).parent.mkdir(parents=True, exist_ok=True)
                (ds / w[key]).write_text('{"responses_create_params": {}}\n')
    return {"checkpoint_root": ckpt_root, "hf_home": hf, "dataset_root": ds}
