"""GRPO's pieces against hand computations: group advantages, the clipped surrogate, microbatch
accumulation equal to the full batch, the k3 KL estimator.

    .venv/bin/python -m pytest -q tests/rl/test_grpo.py
"""
import math

import pytest
import torch

from repro.rl.grpo import clipped_policy_loss, group_advantages, kl_k3, token_logprobs, train_inference_kl


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    a = group_advantages(r, 4, normalize_std=False)
    assert torch.allclose(a, torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]))
    s = group_advantages(r, 4)
    std = torch.tensor([1.0, 0, 0, 0]).std()
    assert torch.allclose(s[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]) / (std + 1e-6))
    assert torch.all(s[4:] == 0)                        # a group that all agrees teaches nothing
    with pytest.raises(ValueError, match="do not split into groups of 3"):
        group_advantages(r, 3)


def test_clipped_loss_by_hand():
    logp = torch.log(torch.tensor([[0.5, 0.9], [0.2, 0.2]]))
    old = torch.log(torch.tensor([[0.25, 0.9], [0.4, 0.2]]))
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, st = clipped_policy_loss(logp, old, adv, mask, num_tokens=3, clip_eps=0.2)
    # ratios: 2.0 (clipped to 1.2 with A=+1), 1.0, 0.5 (A=-1: min(-0.5, -0.8) = -0.8)
    want = -(1.2 * 1 + 1.0 * 1 + (-0.8)) / 3
    assert math.isclose(float(loss), want, rel_tol=1e-6)
    assert float(st["clip_frac"]) == 2.0


def test_microbatches_accumulate_to_the_full_batch_gradient():
    torch.manual_seed(0)
    w = torch.randn(4, 7, requires_grad=True)
    x = torch.randn(6, 5, 4)
    ids = torch.randint(0, 7, (6, 5))
    old = torch.randn(6, 5) * 0.1 - 2
    adv, mask = torch.randn(6), (torch.rand(6, 5) > 0.3).float()
    n = float(mask.sum())

    def loss_of(sl):
        lp = token_logprobs(x[sl] @ w, ids[sl])
        return clipped_policy_loss(lp, old[sl], adv[sl], mask[sl], n)[0]
    loss_of(slice(0, 6)).backward()
    full = w.grad.clone()
    w.grad = None
    for s in range(0, 6, 2):
        loss_of(slice(s, s + 2)).backward()
    assert torch.allclose(w.grad, full, atol=1e-6)


def test_k3_kl_is_nonnegative_and_zero_when_synced():
    p = torch.log_softmax(torch.randn(100), 0)
    q = torch.log_softmax(torch.randn(100), 0)
    assert torch.all(kl_k3(p, q) >= 0)
    assert torch.all(kl_k3(p, p) == 0)
    mask = torch.ones(1, 100)
    assert train_inference_kl(p[None], p[None], mask) == 0.0
    assert train_inference_kl(p[None], q[None], mask) > 0.1
    with pytest.raises(ValueError, match="selects no tokens"):
        train_inference_kl(p[None], q[None], mask * 0)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"advantages must be \[B=2\]"):
        clipped_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3), 6)
    with pytest.raises(ValueError, match="needs the reference"):
        clipped_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), 6, kl_coef=0.1)
