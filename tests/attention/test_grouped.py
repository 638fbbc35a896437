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


def _store_copy_loops(fn, store, *args) -> tuple[torch.Tensor, str]:
    """``fn(store, *args)`` compiled by inductor for the CPU: the store after the call and the generated code."""
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    _, code = run_and_get_code(torch.compile(fn, fullgraph=True, dynamic=False), store, *args)
    return store, "\n".join(code)


@pytest.mark.timeout(240)
def test_a_compiled_per_row_column_write_updates_the_store_in_place():
    """Each row writing its own columns (a verify step's frontier) under torch.compile: the values land where the
    eager write puts them, and the generated code has no loop over the whole store (inductor copies a graph input
    it cannot update in place: with scatter_, the negative control, a whole copy of the cache per layer's write)."""
    from kernels.attention.grouped import write_columns
    g = torch.Generator().manual_seed(0)
    B, G, S, D, q = 2, 2, 1000, 8, 3              # numel 32000: a loop bound no other tensor here has
    store = torch.randn(B, G, S, D, generator=g)
    cols = torch.tensor([[5, 6, 7], [40, 41, 42]])
    new = torch.randn(B, G, q, D, generator=g)
    want = store.clone()
    write_columns(want, cols, new)                 # eager: a scatter
    assert torch.equal(want[1, :, 40:43], new[1]) and torch.equal(want[0, :, 5:8], new[0])

    def write(store, cols, new):
        write_columns(store, cols, new)
        return store[:, :, :8].sum()

    def scatter(store, cols, new):
        store.scatter_(2, cols[:, None, :, None].expand(-1, G, -1, D), new)
        return store[:, :, :8].sum()

    got, code = _store_copy_loops(write, store.clone(), cols, new)
    assert torch.equal(got, want)
    assert f"{store.numel()}L" not in code, "the compiled write copies the whole store"
    got, code = _store_copy_loops(scatter, store.clone(), cols, new)
    assert torch.equal(got, want)
    assert f"{store.numel()}L" in code, "negative control: inductor no longer copies a scattered-into input"
