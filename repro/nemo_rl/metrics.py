"""NeMo-RL's W&B metric names -> the suite's tidy names, so one set of table and figure rules serves
both engines. Importing this module registers the mapper as ``ENGINE_MAPPERS["nemo-rl"]`` of
repro.report.collect (collect imports it when it meets a run whose env.json says engine nemo-rl).

NeMo-RL (NVIDIA-NeMo/RL main @ 7ea279ab, nemo_rl/algorithms/grpo.py and utils/logger.py) logs one
W&B history row per GRPO step (``_step`` = step, from 1) with prefixed keys: ``train/*`` (reward,
losses, the vLLM speculative-decoding counters of nemo_rl/models/generation/vllm/utils.py, draft loss),
``validation/*``, ``timing/train/*`` (seconds per phase) and ``performance/*`` (throughput).
A NeMo-RL history row does not carry the paper row; collect supplies it from env.json (``row``).

Not mapped: the tap wait of Table 2. The pipeline tap channel is NVIDIA-NeMo/RL PR 4060, whose code is
in no snapshot we could read, so its metric name is unknown; NeMo-RL runs leave tap_wait_s unmeasured.

    python -m repro.nemo_rl.metrics        # print the mapping
"""
from __future__ import annotations

import math
import re
from typing import Any

from repro.report.collect import ENGINE_MAPPERS

ENGINE = "nemo-rl"
# NeMo-RL W&B key -> suite metric name (the names the suite's own GRPO runs log).
NAMES = {
    "train/reward": "reward",
    "validation/accuracy": "validation_accuracy",
    "train/gen_kl_error": "train_inference_kl",        # KL(P_generation || P_training), token mean
    "train/kl_penalty": "reference_kl",                # KL to the reference policy
    "train/draft_loss": "draft_loss",
    "train/draft_grad_norm": "draft_grad_norm",
    "timing/train/generation": "rollout_time_s",
    "timing/train/policy_training": "update_time_s",
    "timing/train/total_step_time": "step_time_s",
    "performance/tokens_per_sec": "throughput_tokens_per_s",
}
# Speculative decoding (vLLM counters diffed over the step's rollout). Without drafts (num_drafts 0)
# NeMo-RL still logs acceptance length 1.0 and rate 0.0; those are not acceptance measurements.
SPEC_DRAFTS = "train/vllm/spec_num_drafts"
SPEC_NAMES = {"train/vllm/spec_acceptance_length": "acceptance_length",
              "train/vllm/spec_acceptance_rate": "acceptance_rate"}
SPEC_POSITION = re.compile(r"^train/vllm/spec_acceptance_rate-pos-(\d+)$")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else value


def nemo_rl_mapper(entry: dict[str, Any]) -> list[tuple[str, str, float]]:
    """One NeMo-RL W&B history row -> [(paper row, suite metric, value)]."""
    row = entry.get("row")
    if not isinstance(row, str) or not row:
        raise ValueError("a NeMo-RL history row without its paper row: the run folder's env.json must name "
                         "it ('row'; repro.nemo_rl.run writes it)")
    out = []
    for key, name in NAMES.items():
        value = _number(entry.get(key))
        if value is not None:
            out.append((row, name, value))
    drafts = _number(entry.get(SPEC_DRAFTS))
    if drafts:
        for key, name in SPEC_NAMES.items():
            value = _number(entry.get(key))
            if value is not None:
                out.append((row, name, value))
        for key, value in entry.items():
            match = SPEC_POSITION.match(key)
            if match and _number(value) is not None:
                out.append((row, f"acceptance_rate_pos_{match.group(1)}", _number(value)))
    return out


ENGINE_MAPPERS[ENGINE] = nemo_rl_mapper


if __name__ == "__main__":
    for key, name in {**NAMES, **SPEC_NAMES, "train/vllm/spec_acceptance_rate-pos-{i}": "acceptance_rate_pos_{i}"
                      }.items():
        print(f"{key:45s} -> {name}")
