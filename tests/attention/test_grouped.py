"""grouped_sdpa (grouped query heads folded into the query length) against the fp64 dense oracle: values and
gradients, bool and additive masks, and its errors for bad shapes."""
import pytest
import torch

from kernels.attention.grouped import grouped_sdpa


def dense_reference(q, k, v, mask):
    """softmax(q k^T / sqrt(D) + mask) v with each key/value head repeated to its query heads (fp64)."""
    r = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    bias = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool \
        else mask
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias
    return torch.softmax(scores, -1) @ v


@pytest.mark.timeout(30)
@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize("additive", [False, True])
def test_grouped_sdpa_is_the_dense_oracle(heads, kv_heads, additive):
    g = torch.Generator().manual_seed(0)
    B, Q, S, D = 3, 5, 13, 16
    q, k, v = (torch.randn(B, h, n, D, generator=g, dtype=torch.float64, requires_grad=True)
               for h, n in ((heads, Q), (kv_heads, S), (kv_heads, S)))
    mask = torch.rand(B, 1, Q, S, generator=g) < 0.6
    mask[..., 0] = True                      # every query sees a key
    mask[1, 0, 2] = False
    mask[1, 0, 2, 7] = True                  # a query that sees exactly one key
    m = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, torch.finfo(torch.float64).min) \
        if additive else mask
    got, want = grouped_sdpa(q, k, v, m), dense_reference(q, k, v, m)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    w = torch.randn(got.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((got * w).sum(), (q, k, v))
    wants = torch.autograd.grad((want * w).sum(), (q, k, v))
    for a, b in zip(grads, wants):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.timeout(30)
def test_grouped_sdpa_names_bad_shapes():
    q, kv = torch.zeros(1, 6, 2, 8), torch.zeros(1, 4, 3, 8)
    with pytest.raises(ValueError, match="query heads 6 must be a multiple of key/value heads 4"):
        grouped_sdpa(q, kv, kv, torch.ones(1, 1, 2, 3, dtype=torch.bool))
    kv = torch.zeros(1, 2, 3, 8)
    with pytest.raises(ValueError, match=r"mask must be \[B, 1, 2, 3\]"):
        grouped_sdpa(q, kv, kv, torch.ones(1, 6, 2, 3, dtype=torch.bool))
