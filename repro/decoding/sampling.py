"""Exact speculative verification: rejection sampling with residual resample and bonus token, and greedy mode.

Given the policy's logits at the k+1 verified positions and the draft's k proposals with the
probabilities it drew them from, ``verify`` returns per row how many proposals are accepted and the
one extra token the policy contributes (the residual sample after a rejection, or the bonus token
after k acceptances). The committed tokens are then distributed exactly as plain sampling from the
policy (Leviathan et al. 2023; Chen et al. 2023):

* accept proposal ``d_i ~ q_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))``;
* at the first rejection ``i``, sample from ``norm(max(0, p_i - q_i))``;
* if all k are accepted, sample the bonus from ``p_k``.

Greedy mode accepts ``d_i`` iff it equals ``argmax p_i`` and contributes ``argmax p_a``; that is
token-identical to plain greedy decoding. A draft that proposes greedily while the policy samples
passes ``q = None``: its distribution is the one-hot of its proposal (vLLM's greedy draft sampling).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Verdict:
    accepted: torch.Tensor   # [B] long, number of accepted proposals (0..k)
    next_token: torch.Tensor  # [B] long, the policy's token after the accepted prefix
    probs: torch.Tensor | None = None   # [B, k+1, V] the policy's sampling law (sampling mode; None when greedy)


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Sampling distribution at ``temperature`` (> 0), computed in fp32."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature} (use greedy=True)")
    return torch.softmax(logits.float() / temperature, dim=-1)


def verify(policy_logits: torch.Tensor, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, *,
           greedy: bool, temperature: float = 1.0, generator: torch.Generator | None = None,
           num_valid: torch.Tensor | None = None) -> Verdict:
    """Accept a prefix of ``draft_tokens [B, k]`` against ``policy_logits [B, k+1, V]``.

    ``draft_probs [B, k, V]`` are the distributions the proposals were sampled from (target vocab);
    ``None`` means the proposals are deterministic (one-hot). ``num_valid [B]`` (default k) says how
    many leading proposals of each row are real (a draft may cut its chain, e.g. DSpark's confidence
    schedule): after ``num_valid`` acceptances the extra token is the bonus from ``p[num_valid]``.
    """
    B, k1, V = policy_logits.shape
    k = k1 - 1
    if draft_tokens.shape != (B, k):
        raise ValueError(f"draft_tokens must be [B={B}, k={k}], got {tuple(draft_tokens.shape)}")
    if draft_probs is not None and draft_probs.shape != (B, k, V):
        raise ValueError(f"draft_probs must be [B={B}, k={k}, V={V}], got {tuple(draft_probs.shape)}")
    dev = policy_logits.device
    if num_valid is not None:
        if num_valid.shape != (B,) or bool(((num_valid < 0) | (num_valid > k)).any()):
            raise ValueError(f"num_valid must be [B={B}] with values in [0, {k}], got {num_valid.tolist()}")
        num_valid = num_valid.to(dev, torch.long)
    if greedy:
        return _accept(policy_logits, draft_tokens, None, greedy=True, temperature=1.0, num_valid=num_valid,
                       uniform=None, draw=None)
    u = torch.rand(B, k, device=dev, generator=generator) if k else None
    return _accept(policy_logits, draft_tokens, draft_probs, greedy=False, temperature=temperature,
                   num_valid=num_valid, uniform=u,
                   draw=lambda dist: torch.multinomial(dist, 1, generator=generator).squeeze(1))


def verify_with_noise(policy_logits: torch.Tensor, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, *,
                      greedy: bool, temperature: float = 1.0, num_valid: torch.Tensor | None = None,
                      accept_noise: torch.Tensor | None = None, token_noise: torch.Tensor | None = None) -> Verdict:
    """``verify`` with its randomness passed in: ``accept_noise [B, k]`` and ``token_noise [B, V]`` uniform on
    [0, 1) (``proposal_noise``), the extra token drawn by ``sample_with_noise``. Device work only (no host
    sync, no value checks), so it can be captured in a CUDA graph; the same law as ``verify``."""
    if not greedy and (token_noise is None or (draft_tokens.shape[1] and accept_noise is None)):
        raise ValueError("sampling needs token_noise [B, V] (and accept_noise [B, k] when k > 0)")
    return _accept(policy_logits, draft_tokens, draft_probs, greedy=greedy, temperature=temperature,
                   num_valid=None if num_valid is None else num_valid.long(), uniform=accept_noise,
                   draw=None if greedy else (lambda dist: sample_with_noise(dist, token_noise)))


def _accept(policy_logits, draft_tokens, draft_probs, *, greedy, temperature, num_valid, uniform, draw) -> Verdict:
    B, k1, _V = policy_logits.shape
    k = k1 - 1
    dev = policy_logits.device
    rows = torch.arange(B, device=dev)
    if num_valid is None:
        num_valid = torch.full((B,), k, dtype=torch.long, device=dev)
    if greedy:
        target = policy_logits.argmax(dim=-1)                      # [B, k+1]
        ok = (draft_tokens == target[:, :k]).long()
        accepted = torch.minimum(ok.cumprod(dim=1).sum(dim=1), num_valid)
        return Verdict(accepted, target[rows, accepted])

    p = probs_from_logits(policy_logits, temperature)              # [B, k+1, V]
    if k == 0:
        return Verdict(torch.zeros(B, dtype=torch.long, device=dev), draw(p[:, 0]), p)
    p_d = p[:, :k].gather(2, draft_tokens.unsqueeze(2)).squeeze(2)            # [B, k]
    if draft_probs is None:
        q_d = torch.ones_like(p_d)
    else:
        q_d = draft_probs.float().gather(2, draft_tokens.unsqueeze(2)).squeeze(2)
    ok = (uniform * q_d < p_d).long()                                # u < p/q without dividing by q
    accepted = torch.minimum(ok.cumprod(dim=1).sum(dim=1), num_valid)  # [B]
    # distribution of the extra token: residual at the first rejection, bonus after all valid accepted
    p_a = p[rows, accepted]                                           # [B, V]
    rejected = accepted < num_valid
    a_clamped = accepted.clamp(max=k - 1)
    if draft_probs is None:
        q_a = torch.zeros_like(p_a)
        q_a[rows, draft_tokens[rows, a_clamped]] = 1.0
    else:
        q_a = draft_probs[rows, a_clamped].float()
    residual = (p_a - q_a).clamp_min(0.0)
    mass = residual.sum(dim=1, keepdim=True)
    # mass == 0 cannot follow a rejection in exact arithmetic; guard against rounding with p itself
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_a)
    dist = torch.where(rejected.unsqueeze(1), residual, p_a)
    return Verdict(accepted, draw(dist), p)


def proposal_noise(shape: tuple[int, ...], generator: torch.Generator | None, device) -> torch.Tensor:
    """Uniform ``[0, 1)`` noise (fp32) a draft samples its proposals with (``sample_with_noise``).

    Drawn outside any CUDA graph, so the graphed and the eager proposers consume the generator alike."""
    return torch.rand(shape, generator=generator, device=device, dtype=torch.float32)


def sample_with_noise(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One draw from each distribution ``probs [..., V]`` given uniform noise of the same shape.

    Exponential race: with ``E = -log(u) ~ Exp(1)`` i.i.d., ``argmax(probs / E)`` is token ``i`` with
    probability ``probs[i]`` exactly (the Gumbel-max trick in another form). The only rule by which the
    drafts sample, eager or graphed."""
    return (probs / -torch.log(uniform)).argmax(-1)

