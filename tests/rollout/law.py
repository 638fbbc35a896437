"""The sampled law of a rollout engine against a policy's exact law: Pearson's chi-square and the exact laws of
token pairs, for policies whose vocabulary is small enough to enumerate.

``exact_pair_laws`` runs the policy once over every two-token continuation of a prompt and returns the exact joint
laws of (y1, y2) and (y2, y3) of a three-token completion at a temperature (logits taken to fp64 before the
softmax). ``chi2_pvalue`` compares observed counts with such a law; cells expected below ``min_expected`` counts
are pooled. Used by tests/rollout/test_sampling.py.

    j12, j23 = exact_pair_laws(policy, [3, 1, 4], temperature=1.0)
    chi2_pvalue(torch.bincount(toks[:, 0] * V + toks[:, 1], minlength=V * V), j12)
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def chi2_pvalue(observed: torch.Tensor, expected_probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test; cells with expected count < ``min_expected`` are pooled."""
    obs = observed.double().flatten().cpu()
    n = obs.sum()
    exp = expected_probs.double().flatten().cpu() * n
    small = exp < min_expected
    if small.any():
        obs = torch.cat([obs[~small], obs[small].sum().view(1)])
        exp = torch.cat([exp[~small], exp[small].sum().view(1)])
        if exp[-1] == 0:
            obs, exp = obs[:-1], exp[:-1]
    return _chi2_sf(((obs - exp) ** 2 / exp).sum(), obs.numel() - 1)


def _chi2_sf(stat: torch.Tensor, dof: int) -> float:
    """P(X >= stat) for X chi-square with ``dof`` degrees of freedom."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


@torch.no_grad()
def exact_pair_laws(policy, prompt: Sequence[int], *, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact laws ``[V, V]`` of (y1, y2) and (y2, y3) for a three-token completion of ``prompt`` sampled from
    ``policy`` (a ``repro.models.policy.Policy``) at ``temperature``: one forward over all V*V continuations."""
    V, dev = policy.vocab_size, policy.device
    seqs = torch.cartesian_prod(torch.arange(V), torch.arange(V))                      # [V*V, 2]: (y1, y2)
    full = torch.cat([torch.tensor(list(prompt)).expand(V * V, -1), seqs], 1).to(dev)
    lp = torch.log_softmax(policy.model(full).logits.double() / temperature, -1).cpu()
    n0 = len(prompt)
    p1 = lp[::V, n0 - 1].exp()[0]                                                       # [V]
    p2 = lp[::V, n0].exp()                                                              # [y1, y2]
    p3 = lp[:, n0 + 1].exp().view(V, V, V)                                              # [y1, y2, y3]
    joint12 = p1[:, None] * p2
    joint23 = (joint12[:, :, None] * p3).sum(0)
    return joint12, joint23
