"""The policy's own samples for offline draft training: prompt + rollout token lists from the plain engine.

    from repro.rollout.samples import sample_sequences
    seqs, plens = sample_sequences(policy, prompts, max_new_tokens=64)
"""
from __future__ import annotations

from collections.abc import Sequence

from repro.rollout.engine import RolloutEngine


def sample_sequences(policy, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, greedy: bool = False,
                     temperature: float = 1.0, seed: int = 0, batch_size: int = 64):
    """Prompt + rollout token lists from the plain engine, and the prompt lengths."""
    eng = RolloutEngine(policy, max_model_len=max(len(p) for p in prompts) + max_new_tokens + 1)
    seqs, plens = [], []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        out = eng.generate(chunk, max_new_tokens=max_new_tokens, greedy=greedy, temperature=temperature,
                           seed=seed + i)
        seqs += [list(p) + t for p, t in zip(chunk, out.tokens)]
        plens += [len(p) for p in chunk]
    return seqs, plens
