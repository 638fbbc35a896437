"""GRPO's pieces as pure tensor functions: group-relative advantages, the clipped policy loss, KL estimators.

* ``group_advantages``: rewards ``[n_prompts * G]`` (grouped by prompt) minus their group mean,
  optionally divided by the group std (+eps), as in GRPO (Shao et al. 2024) and NeMo-RL.
* ``clipped_policy_loss``: PPO-style ``-min(r A, clip(r, 1-eps, 1+eps) A)`` with the importance ratio
  ``r = exp(logp_train - logp_rollout)`` against the rollout engine's log-probabilities, aggregated
  over all response tokens of the global batch (token mean; ``num_tokens`` is the global count so
  microbatches accumulate to exactly the full-batch loss).
* ``kl_k3``: Schulman's non-negative k3 estimator ``exp(d) - d - 1`` with ``d = logq - logp``, used
  both for the optional KL-to-reference penalty and for the train-inference KL metric (trainer vs
  rollout log-probabilities of the sampled tokens).

    python -m pytest tests/rl/test_grpo.py
"""
from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, normalize_std: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """Per-sample advantages of ``rewards`` laid out as consecutive groups of ``group_size``."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [n_prompts * group_size], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)
    adv = r - r.mean(dim=1, keepdim=True)
    if normalize_std:
        std = r.std(dim=1, unbiased=True, keepdim=True) if group_size > 1 else torch.zeros_like(r[:, :1])
        adv = adv / (std + eps)
    return adv.view(-1)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``lp[b, t] = log softmax(logits[b, t-1] / T)[input_ids[b, t]]`` for t >= 1; ``lp[:, 0] = 0``."""
    lp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    out = lp.gather(2, input_ids[:, 1:, None]).squeeze(2)
    return torch.cat([out.new_zeros(out.shape[0], 1), out], dim=1)


def kl_k3(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(p || q) from samples of p: ``exp(logq - logp) - (logq - logp) - 1``."""
    d = logq - logp
    return torch.expm1(d) - d


def clipped_policy_loss(logp: torch.Tensor, logp_rollout: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, num_tokens: int | float, clip_eps: float = 0.2,
                        logp_ref: torch.Tensor | None = None, kl_coef: float = 0.0
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate (plus ``kl_coef * KL(policy || ref)``) summed over masked tokens / ``num_tokens``.

    ``logp``, ``logp_rollout``, ``mask``: ``[B, T]``; ``advantages``: ``[B]`` (one per sequence).
    Returns the loss and detached statistics (clip fraction, mean ratio, KL to the reference).
    """
    if logp.shape != logp_rollout.shape or logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, logp_rollout {tuple(logp_rollout.shape)} and mask "
                         f"{tuple(mask.shape)} must have one shape [B, T]")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be [B={logp.shape[0]}], got {tuple(advantages.shape)}")
    if num_tokens <= 0:
        raise ValueError(f"num_tokens must be > 0, got {num_tokens}")
    if kl_coef and logp_ref is None:
        raise ValueError(f"kl_coef={kl_coef} needs the reference log-probabilities (logp_ref)")
    m = mask.float()
    ratio = torch.exp(logp - logp_rollout.detach())
    a = advantages.detach().float()[:, None]
    unclipped = ratio * a
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * a
    per_tok = -torch.minimum(unclipped, clipped)
    stats = {"clip_frac": (((ratio - 1).abs() > clip_eps).float() * m).sum().detach(),
             "ratio_sum": (ratio.detach() * m).sum()}
    if kl_coef:
        kl = kl_k3(logp, logp_ref.detach())
        per_tok = per_tok + kl_coef * kl
        stats["kl_ref_sum"] = (kl.detach() * m).sum()
    loss = (per_tok * m).sum() / num_tokens
    return loss, stats


def train_inference_kl_sum(logp_train: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of the k3 KL(rollout || trainer) over masked tokens, float64 and on the tensors' device (no host sync:
    the update adds these over its microbatches and divides by its token count once)."""
    return (kl_k3(logp_rollout.double(), logp_train.double()) * mask.double()).sum()


def train_inference_kl(logp_train: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean k3 KL(rollout || trainer) over masked tokens (samples come from the rollout engine)."""
    n = float(mask.sum())
    if n == 0:
        raise ValueError("train_inference_kl: the mask selects no tokens")
    return float(train_inference_kl_sum(logp_train, logp_rollout, mask)) / n
