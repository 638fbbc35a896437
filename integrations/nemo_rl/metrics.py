"""NeMo-RL's W&B metric names -> the suite's per-step names, so one set of summary, table and figure
rules serves both engines: ``nemo_rl_mapper`` is repro.report.collect's mapper of runs whose env.json says
engine nemo-rl.

NeMo-RL (NVIDIA-NeMo/RL main @ 7ea279ab: nemo_rl/algorithms/grpo.py, nemo_rl/utils/logger.py,
nemo_rl/models/generation/vllm/utils.py, nemo_rl/algorithms/utils.py) logs one W&B history row per
GRPO step (``_step`` = the step, counted from 1) with prefixed keys: ``train/*`` (reward, losses,
rollout token counts, the vLLM speculative-decoding counters diffed over the step, draft loss),
``validation/*``, ``timing/train/*`` (seconds per phase) and ``performance/*``. The suite's own runs
log ``train/*`` and ``val/*`` per step (repro/rl/trainer.py); this module maps onto those names.
Derived: generated tokens per step = mean generated tokens per sample x samples per step, the latter
being NeMo-RL's ``performance/samples_per_sec`` x its step time (NeMo-RL computes samples_per_sec as
prompts x generations per step / step time); throughputs are generated tokens over step and rollout time.
A NeMo-RL history row does not carry the paper row; collect supplies it from env.json (``row``).

Not mapped: the tap wait of Table 2. The pipeline tap channel is NVIDIA-NeMo/RL PR 4060, whose code is
in no snapshot we could read, so its metric name is unknown; NeMo-RL runs leave tap wait unmeasured.

    python -m integrations.nemo_rl.metrics        # print the mapping
"""
from __future__ import annotations

import math
import re
from typing import Any

ENGINE = "nemo-rl"
# NeMo-RL W&B key -> the suite's per-step metric name.
NAMES = {
    "train/reward": "train/reward",
    "train/mean_gen_tokens_per_sample": "train/response_len",
    "train/gen_kl_error": "train/train_inference_kl",      # KL(P_generation || P_training), token mean
    "train/kl_penalty": "train/kl_ref",                    # KL to the reference policy
    "train/grad_norm": "train/policy_grad_norm",
    "train/draft_loss": "train/draft_loss",
    "train/draft_grad_norm": "train/draft_grad_norm",
    "timing/train/generation": "train/rollout_time_s",
    "timing/train/policy_training": "train/update_time_s",
    "timing/train/total_step_time": "train/step_time_s",
    "timing/train/prepare_for_generation/transfer_and_update_weights": "train/weight_push_s",
    "validation/accuracy": "val/accuracy",
}
# Speculative decoding. Without drafts (num_drafts 0) NeMo-RL still logs acceptance length 1.0 and
# rate 0.0; those are not acceptance measurements and are dropped.
SPEC_DRAFTS = "train/vllm/spec_num_drafts"
SPEC_NAMES = {"train/vllm/spec_acceptance_length": "train/acceptance_length",
              "train/vllm/spec_acceptance_rate": "train/acceptance_rate"}
SPEC_POSITION = re.compile(r"^train/vllm/spec_acceptance_rate-pos-(\d+)$")
GEN_PER_SAMPLE, SAMPLES_PER_S = "train/mean_gen_tokens_per_sample", "performance/samples_per_sec"
STEP_TIME, ROLLOUT_TIME = "timing/train/total_step_time", "timing/train/generation"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else value


def step_metrics(entry: dict[str, Any]) -> dict[str, float]:
    """One NeMo-RL W&B history row -> {suite per-step metric: value}."""
    out = {name: v for key, name in NAMES.items() if (v := _number(entry.get(key))) is not None}
    per_sample, samples_per_s = _number(entry.get(GEN_PER_SAMPLE)), _number(entry.get(SAMPLES_PER_S))
    step_s, rollout_s = _number(entry.get(STEP_TIME)), _number(entry.get(ROLLOUT_TIME))
    if per_sample is not None and samples_per_s and step_s:
        tokens = per_sample * round(samples_per_s * step_s)
        out["train/gen_tokens"] = tokens
        out["train/throughput_tok_s"] = tokens / step_s
        if rollout_s:
            out["train/rollout_tok_s"] = tokens / rollout_s
    if _number(entry.get(SPEC_DRAFTS)):
        out.update({name: v for key, name in SPEC_NAMES.items() if (v := _number(entry.get(key))) is not None})
        for key, value in entry.items():
            match = SPEC_POSITION.match(key)
            if match and (v := _number(value)) is not None:
                out[f"train/acceptance_rate_pos{match.group(1)}"] = v
    return out


def nemo_rl_mapper(entry: dict[str, Any]) -> list[tuple[str, str, float]]:
    """collect's mapper: one NeMo-RL W&B history row -> [(paper row, suite metric, value)]."""
    row = entry.get("row")
    if not isinstance(row, str) or not row:
        raise ValueError("a NeMo-RL history row without its paper row: the run folder's env.json must name "
                         "it ('row'; integrations.nemo_rl.run writes it)")
    return [(row, name, value) for name, value in step_metrics(entry).items()]



if __name__ == "__main__":
    for key, name in {**NAMES, **SPEC_NAMES, "train/vllm/spec_acceptance_rate-pos-{i}": "train/acceptance_rate_pos{i}",
                      f"{GEN_PER_SAMPLE} x {SAMPLES_PER_S} x {STEP_TIME}": "train/gen_tokens"}.items():
        print(f"{key:66s} -> {name}")
