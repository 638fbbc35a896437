"""What a rollout engine is asked and what it returns, shared by every engine (the suite's own, its static loop,
the vLLM backend): ``check_request`` refuses what no engine can serve, ``RolloutResult`` carries the tokens,
their log-probabilities and finish reasons, ``AcceptanceCounters`` the draft's acceptance.

    from repro.rollout.result import AcceptanceCounters, RolloutResult, check_request
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class AcceptanceCounters:
    num_proposals: int
    verify_steps: int = 0            # (row, step) pairs with a proposal
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.accepted_per_pos:
            self.accepted_per_pos = [0] * self.num_proposals

    def add(self, accepted: torch.Tensor, num_valid: torch.Tensor | None = None) -> None:
        k = self.num_proposals
        self.verify_steps += int(accepted.numel())
        self.draft_tokens += k * int(accepted.numel()) if num_valid is None else int(num_valid.sum())
        self.accepted += int(accepted.sum())
        if k:
            per = (accepted.view(-1, 1) > torch.arange(k, device=accepted.device)).sum(0).tolist()
            self.accepted_per_pos = [a + b for a, b in zip(self.accepted_per_pos, per)]

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.verify_steps if self.verify_steps else float("nan")

    def as_dict(self) -> dict:
        return {"num_proposals": self.num_proposals, "verify_steps": self.verify_steps,
                "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "accepted_per_pos": list(self.accepted_per_pos),
                "acceptance_length": self.acceptance_length}


@dataclass
class RolloutResult:
    tokens: list[list[int]]
    logprobs: list[list[float]]
    finish_reason: list[str]          # "stop" or "length"
    counters: AcceptanceCounters
    policy_forwards: int
    cache_compactions: int = 0        # times the policy cache's dead slots were squeezed out
    cache_slots: int = 0              # policy cache length at the end


def check_request(prompts: Sequence[Sequence[int]], max_new_tokens: int, greedy: bool, temperature: float, *,
                  num_proposals: int, max_model_len: int, vocab_size: int) -> None:
    """Refuse a generate() request any engine cannot serve, naming the bad value (shared with the vLLM backend)."""
    if not prompts:
        raise ValueError("generate() needs at least one prompt")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    for i, p in enumerate(prompts):
        n = len(p)
        if n < 1:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        if n + max_new_tokens + num_proposals > max_model_len:
            raise ValueError(f"prompt {i} has {n} tokens; with max_new_tokens={max_new_tokens} and "
                             f"{num_proposals} proposals per step it needs {n + max_new_tokens + num_proposals} "
                             f"positions, over the limit max_model_len={max_model_len}")
        bad = [t for t in p if not 0 <= int(t) < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has token ids {bad[:4]} outside the vocabulary [0, {vocab_size})")
    if not greedy and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
