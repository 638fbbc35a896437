"""The decode-step attention kernel (kernels.attention.decode_triton) against the fp64 dense oracle under Triton's
interpreter: grouped heads, one and several queries, key counts off the tile, the strided layouts the model passes
(queries transposed from ``[B, q, H, D]``, a mask sliced from a wider one), additive and bool masks, a row whose
every key is masked (the mean of the values under an additive mask, as SDPA; 0 under a bool one); grouped_sdpa's
rule for when a step goes to it; and the kernel's Triton IR for sm90 with the scale typed as inductor may type it.

Without a GPU, tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported, so the kernel runs on CPU
tensors (fp32); on a GPU (sm80+) the same checks run the compiled kernel on bf16 tensors (the rule sends it bf16
and fp16 only), to bf16's tolerance.
"""
import os

import pytest
import torch
from test_grouped import dense_reference
from triton_ir import build_ir

from kernels.attention import grouped


class Where:
    """The kernel module and where its checks run: CPU fp32 tensors under Triton's interpreter, or a GPU's bf16."""

    def __init__(self, module, device: str, dtype: torch.dtype, tol: float):
        self.launch, self.device, self.dtype, self.tol = module.launch, device, dtype, tol

    def put(self, *tensors):
        return tuple(t.to(self.device, self.dtype) for t in tensors)


@pytest.fixture(scope="module")
def kernel():
    if torch.cuda.is_available():
        if torch.cuda.get_device_capability()[0] < 8:
            pytest.skip("the kernel's GPU route is sm80+")
        from kernels.attention import decode_triton
        return Where(decode_triton, "cuda", torch.bfloat16, 2e-2)
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("without a GPU these checks run the kernel under Triton's interpreter")
    from kernels.attention import decode_triton
    return Where(decode_triton, "cpu", torch.float32, 1e-5)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("boolean", [False, True], ids=["additive", "bool"])
@pytest.mark.parametrize("heads,kv_heads,Q,S", [(4, 2, 1, 150), (8, 2, 5, 70), (4, 4, 3, 64), (6, 3, 8, 9)])
def test_kernel_is_the_dense_oracle(kernel, heads, kv_heads, Q, S, boolean):
    g = torch.Generator().manual_seed(Q * S)
    B, D = 3, 16
    q, = kernel.put(torch.randn(B, Q, heads, D, generator=g))
    q = q.transpose(1, 2)                                                  # the model's layout: a transposed view
    k, v = (t[:, :, :S] for t in kernel.put(*(torch.randn(B, kv_heads, S + 7, D, generator=g) for _ in range(2))))
    vis = torch.rand(B, 1, Q, S + 5, generator=g) < 0.6                    # k, v: cache views
    vis[..., 0] = True
    vis[1, 0, Q - 1, :] = False                                            # a query that sees no key
    wide = vis if boolean else torch.zeros(vis.shape).masked_fill(~vis, torch.finfo(kernel.dtype).min)
    mask = wide.to(kernel.device) if boolean else kernel.put(wide)[0]
    mask = mask[..., :S]
    out = torch.full((B, Q, heads, D), float("nan"), dtype=kernel.dtype, device=kernel.device)
    kernel.launch(q, k, v, mask, D ** -0.5, out, num_warps=1)
    got = out.transpose(1, 2).double().cpu()
    q, k, v, mask = (t.cpu() for t in (q, k, v, mask))
    if boolean:
        seen = mask[1, 0, Q - 1].clone()
        mask = mask.clone()
        mask[1, 0, Q - 1, 0] = True                                        # the oracle needs a key to see; the row
        assert torch.equal(got[1, :, Q - 1], torch.zeros_like(got[1, :, Q - 1])) and not seen.any()   # is 0 here
        got[1, :, Q - 1] = v.double().repeat_interleave(heads // kv_heads, 1)[1, :, 0]
    want = dense_reference(q.double(), k.double(), v.double(), mask if boolean else mask.double())
    torch.testing.assert_close(got, want, rtol=kernel.tol, atol=kernel.tol)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("heads,kv_heads,Q,S,cols", [(4, 2, 1, 150, [97]), (8, 2, 5, 70, [60, 61, 62, 63, 64]),
                                                      (6, 3, 8, 40, [3, 30, 31, 5, 36, 37, 38, 39])])
def test_write_variant_writes_the_step_then_attends(kernel, heads, kv_heads, Q, S, cols):
    """``new=``: the step's keys and values go into the cache view's columns ``cols`` (any distinct ones, in any
    order) and the attention reads them there, as index_copy into the cache and then the oracle; the cache's other
    columns, and the buffer past the view, are untouched."""
    g = torch.Generator().manual_seed(Q * S)
    B, D = 3, 16
    q, k_new, v_new = kernel.put(torch.randn(B, Q, heads, D, generator=g),
                                 *(torch.randn(B, Q, kv_heads, D, generator=g) for _ in range(2)))
    q, k_new, v_new = (t.transpose(1, 2) for t in (q, k_new, v_new))      # HF's layouts: transposed views
    k_buf, v_buf = kernel.put(*(torch.randn(B, kv_heads, S + 7, D, generator=g) for _ in range(2)))
    at = torch.tensor(cols, device=kernel.device)
    k_want, v_want = k_buf.clone(), v_buf.clone()
    k_want[:, :, :S].index_copy_(2, at, k_new)
    v_want[:, :, :S].index_copy_(2, at, v_new)
    hidden = torch.rand(B, 1, Q, S, generator=g) < 0.3
    mask, = kernel.put(torch.zeros(B, 1, Q, S).masked_fill(hidden, torch.finfo(kernel.dtype).min))
    mask[..., at] = 0.0                                                     # the step sees its own keys
    out = torch.full((B, Q, heads, D), float("nan"), dtype=kernel.dtype, device=kernel.device)
    kernel.launch(q, k_buf[:, :, :S], v_buf[:, :, :S], mask, D ** -0.5, out, num_warps=1, new=(k_new, v_new, at))
    assert torch.equal(k_buf, k_want) and torch.equal(v_buf, v_want)
    q, k_want, v_want, mask = (t.double().cpu() for t in (q, k_want, v_want, mask))
    want = dense_reference(q, k_want[:, :, :S], v_want[:, :, :S], mask)
    torch.testing.assert_close(out.transpose(1, 2).double().cpu(), want, rtol=kernel.tol, atol=kernel.tol)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("heads,kv_heads,Q,S", [(4, 2, 1, 150), (8, 2, 5, 130), (6, 3, 9, 70)])
def test_per_row_columns_and_the_frontier(kernel, heads, kv_heads, Q, S):
    """``new=`` with ``cols [B, q]``: each row's keys and values go into its own columns (rows of different
    lengths in one view, as the static cache's verify steps write them), then the oracle. With ``frontier`` a row
    reads only up to its last new column: the columns past it hold NaN here (a stale cache), hidden by the mask,
    and the output is still the oracle's; without it the kernel reads them and the NaN reaches the output."""
    g = torch.Generator().manual_seed(Q * S + 1)
    B, D = 3, 16
    q, k_new, v_new = kernel.put(torch.randn(B, Q, heads, D, generator=g),
                                 *(torch.randn(B, Q, kv_heads, D, generator=g) for _ in range(2)))
    q, k_new, v_new = (t.transpose(1, 2) for t in (q, k_new, v_new))
    starts = torch.tensor([S - Q, 1, S // 2])                               # each row's first new column
    at = (starts[:, None] + torch.arange(Q)).to(kernel.device)
    col = torch.arange(S)
    past = col[None, :] > at.cpu()[:, -1:]                                  # [B, S]: past each row's frontier
    hidden = (torch.rand(B, 1, Q, S, generator=g) < 0.3) | past[:, None, None, :]
    hidden[torch.arange(B)[:, None], 0, :, at.cpu()] = False                # the step sees its own keys
    for frontier, finite in ((True, True), (False, False)):
        k_buf, v_buf = kernel.put(*(torch.randn(B, kv_heads, S, D, generator=g) for _ in range(2)))
        k_buf[past[:, None, :, None].expand_as(k_buf).to(kernel.device)] = float("nan")
        k_want, v_want = k_buf.clone(), v_buf.clone()
        for b in range(B):
            k_want[b].index_copy_(1, at[b], k_new[b])
            v_want[b].index_copy_(1, at[b], v_new[b])
        mask, = kernel.put(torch.zeros(B, 1, Q, S).masked_fill(hidden, torch.finfo(kernel.dtype).min))
        out = torch.full((B, Q, heads, D), float("nan"), dtype=kernel.dtype, device=kernel.device)
        kernel.launch(q, k_buf, v_buf, mask, D ** -0.5, out, num_warps=1, new=(k_new, v_new, at), frontier=frontier)
        assert torch.equal(k_buf.nan_to_num(7.0), k_want.nan_to_num(7.0)) and torch.equal(v_buf, v_want)
        assert bool(out.isfinite().all()) == finite
        if finite:
            kw = k_want.nan_to_num(0.0)                                     # the oracle never sees past the frontier
            qd, kd, vd, md = (t.double().cpu() for t in (q, kw, v_want, mask))
            want = dense_reference(qd, kd, vd, md)
            torch.testing.assert_close(out.transpose(1, 2).double().cpu(), want, rtol=kernel.tol, atol=kernel.tol)


@pytest.mark.timeout(30)
def test_rule_sends_small_half_precision_steps(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))     # the rule, not the device
    bf = dict(dtype=torch.bfloat16)
    q, k, v = torch.zeros(2, 16, 5, 128, **bf), torch.zeros(2, 8, 40, 128, **bf), torch.zeros(2, 8, 40, 128, **bf)
    additive = torch.zeros(2, 1, 5, 40, **bf)
    fits = grouped.decode_kernel_fits
    assert fits(q, k, v, additive)
    assert fits(q, k, v, additive.bool())                                         # bool masks too
    assert not fits(q.float(), k.float(), v.float(), additive.float())            # fp32: SDPA
    assert not fits(torch.zeros(2, 16, 33, 128, **bf), k, v, torch.zeros(2, 1, 33, 40, **bf))   # 66 folded rows
    assert not fits(torch.zeros(2, 16, 5, 96, **bf), k[..., :96], v[..., :96], additive)         # head dim 96
    assert not fits(q, k, v, torch.zeros(2, 1, 40, 5, **bf).transpose(2, 3))      # mask not unit-strided


@pytest.mark.timeout(30)
def test_impl_is_checked():
    x = torch.zeros(1, 2, 1, 16)
    with pytest.raises(ValueError, match="impl must be 'auto' or 'sdpa', got 'flash'"):
        grouped.grouped_sdpa(x, x, x, torch.zeros(1, 1, 1, 1), impl="flash")




@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", ["attend", "write"])
@pytest.mark.parametrize("scale_type", ["fp32", "fp64"])
def test_kernel_builds_when_inductor_passes_the_scale_as_fp64(scale_type, variant):
    """Under torch.compile, inductor types a Python float argument of a user Triton kernel as fp64
    (torch._inductor.config._use_fp64_for_unbacked_floats): the kernel's Triton IR for an sm90 target must build with
    either type (an fp64 scale once turned the softmax's loop state fp64 and failed the build)."""
    run = build_ir("kernels.attention.decode_triton", "_decode_attention_kernel",
                   {"BLOCK_M": 16, "BLOCK_S": 64, "D": 128, "BOOL_MASK": False, "WRITE": variant == "write",
                    "BLOCK_Q": 8, "FRONTIER": variant == "write"},
                   {"scale": scale_type, "m_ptr": "*fp32", "c_ptr": "*i64"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "tt.dot" in run.stdout
