"""Everything one NeMo-RL row needs, checked before anything is launched or submitted.

One CheckError lists every missing thing, each named with what was expected:
  - the NeMo-RL checkout (repro.core.profile.missing_paths), its example config and entry script,
    and the co-training stack the row needs (read from the checkout's source, never imported):
    EAGLE-3 TTT (PR 3699), DFlash (3712), DSpark (3713), drafts under CP or with packing (4059),
    block drafts under PP (4060);
  - the row's checkpoints (missing_paths again), each with a config.json, and a block draft's
    block size against its checkpoint;
  - the datasets: the math sets in the HF cache (--hf-home), the Workplace Assistant JSONL (--dataset-root);
  - the launcher: for a local run, one node with enough GPUs of the profile's model and ``uv``; for
    SLURM, ``sbatch`` and a container image.

    python -m integrations.nemo_rl.run --artifact table1 --row Qwen3-8B/DFlash --profile paper-h100 --dry-run ...
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from integrations.nemo_rl.config import Paths
from integrations.nemo_rl.rows import RowSpec
from integrations.nemo_rl.skeleton import SkeletonError, typed_dict_keys
from repro.core.profile import missing_paths
from repro.core.provenance import hardware

DRAFT_DIR = "nemo_rl/models/megatron/draft"
POLICY_INIT = "nemo_rl/models/policy/__init__.py"
LM_POLICY = "nemo_rl/models/policy/lm_policy.py"
# Refusals the co-training stack raises today (where to look, the text); present in a checkout = that
# checkout lacks the PR. Packing is refused at policy start-up (lm_policy.py) and in the draft modules.
REFUSALS = {
    "pp_block": ((f"{DRAFT_DIR}/utils.py",), "requires pipeline_model_parallel_size",
                 "NVIDIA-NeMo/RL PR 4060 (block drafts, DFlash/DSpark, under pipeline parallelism)"),
    "cp": ((DRAFT_DIR,), "requires context_parallel_size == 1",
           "NVIDIA-NeMo/RL PR 4059 (drafts under context parallelism)"),
    "packing": ((LM_POLICY, DRAFT_DIR), "does not support sequence packing",
                "NVIDIA-NeMo/RL PR 4059 (draft training on packed sequences)"),
}


class CheckError(ValueError):
    """A row that cannot run here: every missing path, capability or resource, named."""


def _read(path: Path) -> str:
    """Python source of a file (or of a folder's modules), implicitly concatenated strings joined."""
    if path.is_dir():
        text = "\n".join(p.read_text(errors="replace") for p in sorted(path.glob("*.py")))
    else:
        text = path.read_text(errors="replace") if path.is_file() else ""
    return re.sub(r"([\"'])\s*\n\s*\1", "", text)


def checkout_problems(spec: RowSpec, nemo: Path, launcher: str) -> list[str]:
    """What the checkout lacks for this row (files, then the draft stack's capabilities)."""
    out = []
    needed = [spec.workload.example, spec.workload.entry] + (["ray.sub"] if launcher == "ray-sub" else [])
    out += [f"{rel} in the NeMo-RL checkout {nemo}" for rel in needed if not (nemo / rel).is_file()]
    fam, lay = spec.family, spec.layout
    if fam is None:
        return out
    try:
        draft_cfg = set(typed_dict_keys(_read(nemo / POLICY_INIT), "DraftConfig"))
    except (SkeletonError, SyntaxError):
        draft_cfg = set()
        out.append(f"DraftConfig (online draft training) in {nemo / POLICY_INIT}")
    if fam.method in ("dflash", "dspark"):
        if not (nemo / DRAFT_DIR / f"{fam.method}.py").is_file() or "method" not in draft_cfg:
            pr = "3712" if fam.method == "dflash" else "3713"
            out.append(f"{fam.name} co-training in the NeMo-RL checkout {nemo} ({DRAFT_DIR}/{fam.method}.py and "
                       f"DraftConfig.method; NVIDIA-NeMo/RL PR {pr})")
    elif int(fam.settings.get("ttt_steps", 1)) > 1 and "ttt_steps" not in draft_cfg:
        out.append(f"multi-pass EAGLE-3 in the NeMo-RL checkout {nemo} (DraftConfig.ttt_steps; NVIDIA-NeMo/RL PR 3699)")
    uses = {"pp_block": fam.method in ("dflash", "dspark") and lay.pp > 1, "cp": lay.cp > 1,
            "packing": spec.sequence_packing}
    packed = "packed" if spec.sequence_packing else "unpacked"
    for key, (rels, text, what) in REFUSALS.items():
        raising = [rel for rel in rels if text in _read(nemo / rel)]
        if uses[key] and raising:
            out.append(f"{what} in the NeMo-RL checkout {nemo} ({', '.join(raising)} still raises '...{text}...'); "
                       f"row {spec.row!r} needs TP/PP/CP = {lay.tp}/{lay.pp}/{lay.cp} with {packed} sequences"
                       + (" (--layout upstream-today runs PP = CP = 1 unpacked: not the paper's layout)"
                          if spec.is_paper_layout else ""))
    return out


def _block_size_in(config_json: Path) -> int | None:
    try:
        cfg = json.loads(config_json.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    for source in (cfg.get("dflash_config") or {}, cfg):
        if "block_size" in source:
            return int(source["block_size"])
    return None


def checkpoint_problems(spec: RowSpec, paths: Paths) -> list[str]:
    """config.json in each of the row's checkpoints; a block draft's block size against its checkpoint."""
    out = []
    keys = [spec.model_checkpoint] + ([spec.draft_checkpoint] if spec.draft_checkpoint else [])
    for key in keys:
        path = paths.checkpoint(spec, key)
        if path.is_dir() and not (path / "config.json").is_file():
            out.append(f"config.json in checkpoint {key} ({path}; expected a Hugging Face checkpoint folder)")
    if spec.block_size is not None:
        cfg = paths.checkpoint(spec, spec.draft_checkpoint) / "config.json"
        found = _block_size_in(cfg) if cfg.is_file() else None
        if found is not None and found != spec.block_size:
            out.append(f"a draft checkpoint of the profile's block size: {cfg} records block_size {found}, the "
                       f"profile says {spec.block_size} (nemo_rl.draft_checkpoints of profile {spec.profile})")
    return out


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def dataset_problems(spec: RowSpec, paths: Paths) -> list[str]:
    w = spec.workload.settings
    if "train_file" in w:
        if paths.dataset_root is None:
            return [(f"dataset_root (set --dataset-root to the folder holding {w['train_file']} and "
                     f"{w['validation_file']}, the NeMo Gym Workplace Assistant data)")]
        return [f"dataset {paths.dataset_root / w[k]} (no such file)" for k in ("train_file", "validation_file")
                if not (paths.dataset_root / w[k]).is_file()]
    hf_ids = w.get("hf_datasets") or []
    if not hf_ids:
        return []
    fetch = ("fetch once with: HF_HOME=<dir> uv run python -c \"from datasets import load_dataset; "
             + "; ".join(f"load_dataset('{d}', split='train')" for d in hf_ids) + "\" in the NeMo-RL checkout")
    if paths.hf_home is None:
        return [f"hf_home (set --hf-home to the Hugging Face cache holding {', '.join(hf_ids)}; {fetch})"]
    names = [_norm(p.name) for sub in ("hub", "datasets") for p in (paths.hf_home / sub).glob("*")
             if (paths.hf_home / sub).is_dir()]
    out = []
    for ds in hf_ids:
        org, _, name = ds.partition("/")
        if not any(_norm(org) in n and _norm(name) in n for n in names):
            out.append(f"dataset {ds} in the Hugging Face cache {paths.hf_home} (hub/ or datasets/); {fetch}")
    return out


def gpu_problems(spec: RowSpec, profile: dict[str, Any], machine: dict[str, Any]) -> list[str]:
    """A local launch runs on this one node: it must hold the row's GPUs, of the profile's model."""
    lay, out = spec.layout, []
    if lay.nodes > 1:
        return [(f"a launcher for {lay.nodes} nodes x {lay.gpus_per_node} GPUs: a local launch runs on one node "
                 "(use --launcher ray-sub)")]
    gpus = machine["gpus"]["devices"]
    if len(gpus) < lay.gpus:
        have = f"{len(gpus)} ({gpus[0]['name']})" if gpus else "none"
        out.append(f"{lay.gpus} GPUs for TP/PP/CP/EP = {lay.tp}/{lay.pp}/{lay.cp}/{lay.ep} (detected: {have})")
    model = profile.get("hardware", {}).get("gpu_model")
    if model and gpus and not all(model.lower() in g["name"].lower() for g in gpus[: lay.gpus]):
        out.append(f"GPU model {model} (detected: {gpus[0]['name']})")
    return out


def launcher_problems(launcher: str, container: str | None) -> list[str]:
    if launcher == "local":
        return [] if shutil.which("uv") else [("uv on PATH (NeMo-RL runs with `uv run` in its checkout; "
                                               "https://docs.astral.sh/uv/)")]
    out = [] if shutil.which("sbatch") else ["sbatch on PATH (the ray-sub launcher submits NeMo-RL's ray.sub)"]
    if not container:
        out.append("container (set --container to the NeMo-RL container image ray.sub runs in)")
    return out


def problems(spec: RowSpec, profile: dict[str, Any], paths: Paths | None, launcher: str, *,
             container: str | None = None, machine: dict[str, Any] | None = None) -> tuple[list[str], list[str]]:
    """(what the row lacks on disk: checkout, its draft stack, checkpoints, datasets;
        what this machine lacks to launch it: GPUs for a local run, uv, sbatch, a container)."""
    keys = [spec.model_checkpoint] + ([spec.draft_checkpoint] if spec.draft_checkpoint else [])
    row_profile = {**profile, "checkpoints": {k: spec.checkpoints[k] for k in keys}}
    paths = paths or Paths(None, None)
    config = {"checkpoint_root": str(paths.checkpoint_root or ""), "nemo_rl_dir": str(paths.nemo_rl_dir or "")}
    on_disk = missing_paths(row_profile, config)
    if paths.nemo_rl_dir is not None and (paths.nemo_rl_dir / "nemo_rl").is_dir():
        on_disk += checkout_problems(spec, paths.nemo_rl_dir, launcher)
    if paths.checkpoint_root is not None:
        on_disk += checkpoint_problems(spec, paths)
    on_disk += dataset_problems(spec, paths)
    here = []
    if launcher == "local":
        here += gpu_problems(spec, profile, machine if machine is not None else hardware())
    here += launcher_problems(launcher, container)
    return on_disk, here


def describe(spec: RowSpec, launcher: str, missing: list[str]) -> str:
    return (f"{spec.artifact} row {spec.row!r} (profile {spec.profile}, {launcher} launch) cannot start: "
            "missing " + "; ".join(missing))


def check_row(spec: RowSpec, profile: dict[str, Any], paths: Paths | None, launcher: str, *,
              container: str | None = None, machine: dict[str, Any] | None = None) -> None:
    """Raise one CheckError naming everything this row lacks; return when it can be launched."""
    on_disk, here = problems(spec, profile, paths, launcher, container=container, machine=machine)
    if on_disk or here:
        raise CheckError(describe(spec, launcher, on_disk + here))
