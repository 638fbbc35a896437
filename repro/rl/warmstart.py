"""Building the policy and drafts of a run, from scratch or from the cached SFT warm start.

A warm-start folder (written by ``repro.rl.sft``) holds ``policy.pt`` (architecture + weights),
``drafts/<family>.pt`` (each draft's spec + weights, trained offline on the SFT policy: our stand-in
for the families' official checkpoints) and ``tokenizer/``. Shapes and specs are checked on load,
and a mismatch names what differs. A policy spec with ``checkpoint`` (paper profiles with ``--engine
suite``) is loaded from its local HF folder instead (``local_files_only``: nothing is downloaded).

    policy = make_policy(cfg.policy, vocab_size, seed=0, dtype=torch.float32, device="cpu", warm_start=dir)
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from repro.core.specs import DraftSpec, PolicySpec
from repro.models.policy import Policy, build_policy

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def update_autocast_dtype(dtype: str, device: str) -> torch.dtype | None:
    """The update's autocast dtype: on a GPU the profile's dtype (over fp32 master weights), else None (fp32)."""
    return DTYPES[dtype] if str(device).startswith("cuda") and DTYPES[dtype] != torch.float32 else None


def check_autocast_dtype(dtype: torch.dtype | None) -> None:
    """ValueError naming ``dtype`` unless an update can autocast to it (None: no autocast)."""
    if dtype not in (None, torch.bfloat16, torch.float16):
        raise ValueError(f"autocast_dtype must be None, torch.bfloat16 or torch.float16, got {dtype}")


def autocast_or_off(device_type: str, dtype: torch.dtype | None):
    """``torch.autocast(device_type, dtype)``, or a context that changes nothing when ``dtype`` is None."""
    return torch.autocast(device_type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def load_checkpoint_policy(spec: PolicySpec, *, dtype: torch.dtype, device: str) -> Policy:
    """The checkpoint of ``spec`` (validated first: a missing folder or config.json fails before loading)."""
    spec.validate()
    from transformers import AutoConfig, AutoModelForCausalLM
    model_type = AutoConfig.from_pretrained(spec.path, local_files_only=True).model_type
    model = AutoModelForCausalLM.from_pretrained(spec.path, local_files_only=True, dtype=dtype,
                                                 attn_implementation="eager" if model_type == "gpt_oss" else "sdpa")
    model.generation_config.bos_token_id = model.generation_config.eos_token_id = None   # engine's stop tokens
    return Policy(model.to(device=device).eval(), family=model_type)


def make_policy(spec: PolicySpec, vocab_size: int, *, seed: int, dtype: torch.dtype, device: str,
                warm_start: str | Path = ""):
    if spec.checkpoint:
        if warm_start:
            raise ValueError(f"checkpoint policy {spec.checkpoint!r} starts from its checkpoint, not from the "
                             f"warm start {warm_start}")
        policy = load_checkpoint_policy(spec, dtype=dtype, device=device)
        if policy.vocab_size != vocab_size:
            raise ValueError(f"checkpoint {spec.path} has vocab_size {policy.vocab_size}, this run needs {vocab_size}")
        return policy
    policy = build_policy(spec.family, spec.scale, seed=seed, dtype=torch.float32, device="cpu",
                          vocab_size=vocab_size, **spec.overrides)
    if warm_start:
        path = Path(warm_start) / "policy.pt"
        if not path.is_file():
            raise FileNotFoundError(f"warm start {path} not found; build it with `python -m repro.rl.sft` "
                                    "(the workflow's rl_sft rule)")
        saved = torch.load(path, map_location="cpu", weights_only=False)
        want = {"family": spec.family, "scale": spec.scale, "overrides": dict(spec.overrides),
                "vocab_size": vocab_size}
        got = {k: saved.get(k) for k in want}
        if got != want:
            raise ValueError(f"warm start {path} is for policy {got}, this run needs {want}")
        policy.model.load_state_dict(saved["state_dict"])
    return policy.to(device=device, dtype=dtype)


def draft_file(warm_start: str | Path, family: str) -> Path:
    return Path(warm_start) / "drafts" / f"{family}.pt"


def load_draft_weights(draft, spec: DraftSpec, warm_start: str | Path) -> bool:
    """Load the warm-started draft of ``spec.family`` if the warm start has one; False otherwise."""
    if not warm_start:
        return False
    path = draft_file(warm_start, spec.family)
    if not path.is_file():
        return False
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if saved.get("options") != dict(spec.options):
        raise ValueError(f"warm-start draft {path} has options {saved.get('options')}, this run needs "
                         f"{dict(spec.options)} (rebuild the warm start or align rl.drafts in the profile)")
    draft.load_state_dict(saved["state_dict"])
    return True
