"""Chi-square goodness-of-fit without scipy: Pearson's statistic and its p-value via the regularised gamma."""
import torch


def chi2_pvalue(observed: torch.Tensor, expected_probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test; cells with expected count < ``min_expected`` are pooled."""
    obs = observed.double().flatten()
    n = obs.sum()
    exp = expected_probs.double().flatten() * n
    small = exp < min_expected
    if small.any():
        obs = torch.cat([obs[~small], obs[small].sum().view(1)])
        exp = torch.cat([exp[~small], exp[small].sum().view(1)])
        if exp[-1] == 0:
            obs, exp = obs[:-1], exp[:-1]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))
