"""EAGLE-3's reduced draft vocabulary: the ``d2t`` / ``t2d`` maps, built from token counts and validated.

Conventions (EAGLE, SpecForge, vLLM, NeMo-RL): draft id ``i`` is target id ``i + d2t[i]`` (``d2t``
stores offsets), and ``t2d`` is a bool mask over the target vocabulary marking the tokens the draft
can emit. Draft ids are the kept target ids in increasing order.

    d2t, t2d = build_draft_vocab(token_counts, draft_vocab_size=512)
    target_ids = draft_to_target_ids(d2t)
"""
from __future__ import annotations

import torch


def build_draft_vocab(token_counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the ``draft_vocab_size`` most frequent target tokens (ties: lower id first)."""
    V = token_counts.numel()
    if not 1 <= draft_vocab_size <= V:
        raise ValueError(f"draft_vocab_size must be in [1, {V}] (the target vocabulary), got {draft_vocab_size}")
    order = torch.argsort(-token_counts.double().cpu() * (V + 1) + torch.arange(V, dtype=torch.float64))
    keep = torch.sort(order[:draft_vocab_size]).values
    d2t = keep - torch.arange(draft_vocab_size)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[keep] = True
    return d2t.long(), t2d


def full_draft_vocab(V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The identity maps (draft vocabulary == target vocabulary)."""
    return torch.zeros(V, dtype=torch.long), torch.ones(V, dtype=torch.bool)


def draft_to_target_ids(d2t: torch.Tensor) -> torch.Tensor:
    return torch.arange(d2t.numel(), device=d2t.device) + d2t


def check_vocab_maps(d2t: torch.Tensor, t2d: torch.Tensor, target_vocab_size: int) -> None:
    """Raise if ``d2t`` and ``t2d`` do not describe the same set of target tokens, in increasing order."""
    if t2d.dtype != torch.bool or t2d.dim() != 1 or t2d.numel() != target_vocab_size:
        raise ValueError(f"t2d must be a bool mask over the {target_vocab_size}-token target vocabulary, got "
                         f"dtype {t2d.dtype} shape {tuple(t2d.shape)}")
    if d2t.dim() != 1 or d2t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"d2t must be a 1-D integer tensor of offsets, got dtype {d2t.dtype} shape {tuple(d2t.shape)}")
    tid = draft_to_target_ids(d2t.cpu().long())
    bad = ((tid < 0) | (tid >= target_vocab_size)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"vocabulary maps disagree: d2t maps draft id {i} to target id {int(tid[i])}, outside "
                         f"[0, {target_vocab_size})")
    if bool((tid[1:] <= tid[:-1]).any()):
        raise ValueError("vocabulary maps disagree: d2t target ids must be strictly increasing (draft ids are the "
                         "kept target ids in order)")
    if int(t2d.sum()) != d2t.numel():
        raise ValueError(f"vocabulary maps disagree: t2d keeps {int(t2d.sum())} target tokens but d2t has "
                         f"{d2t.numel()} draft tokens")
    miss = (~t2d.cpu()[tid]).nonzero().flatten()
    if miss.numel():
        i = int(miss[0])
        raise ValueError(f"vocabulary maps disagree: d2t maps draft id {i} to target id {int(tid[i])}, which t2d "
                         "does not keep")
