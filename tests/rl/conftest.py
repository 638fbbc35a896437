"""Shared fixtures of the repro.rl tests: a small trained tokenizer and tiny run configs (CPU, fp32)."""
from __future__ import annotations

import pytest
import torch

from repro.core.specs import DraftSpec, GRPOSpec, PolicySpec, SFTSpec, WorkloadSpec
from repro.rl.config import RunConfig
from repro.rl.tokenizer import train_tokenizer, workload_corpus

TINY_POLICY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 8, "num_attention_heads": 2,
               "num_key_value_heads": 1, "head_dim": 16}
DRAFTS = {
    "eagle3": DraftSpec("eagle3", num_proposals=2, options={"ttt_steps": 2}),
    "dflash": DraftSpec("dflash", num_proposals=3, options={"block_size": 4, "num_layers": 1, "num_anchors": 4}),
    "dspark": DraftSpec("dspark", num_proposals=3, options={"block_size": 3, "num_layers": 1, "num_anchors": 4}),
}


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setenv("WANDB_MODE", "disabled")     # scoped: later tests (tests/report) run wandb offline


@pytest.fixture(scope="session")
def tok():
    return train_tokenizer(workload_corpus(0, n_math=200, n_tools=100), vocab_size=300)


def tiny_config(out, *, draft: str | None = None, steps: int = 2, workload: str = "math", family: str = "qwen3",
                **kw) -> RunConfig:
    overrides = dict(TINY_POLICY)
    if family == "qwen3_moe":
        overrides.update(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32)
    return RunConfig(artifact="table1", row="test row", profile="cpu-tiny", out=str(out), steps=steps,
                     policy=PolicySpec(family, "tiny", overrides),
                     draft=DRAFTS[draft] if draft else None,
                     grpo=GRPOSpec(prompts_per_step=2, generations_per_prompt=2, max_new_tokens=10, microbatch=2,
                                   lr=1e-3),
                     workload=WorkloadSpec(name=workload, val_every=100, val_size=2, tool_latency_s=0.0,
                                           max_tool_calls=2),
                     sft=SFTSpec(steps=2, batch=2, draft_steps=1), vocab_size=300, **kw)
