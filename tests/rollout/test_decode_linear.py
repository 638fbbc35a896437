"""The decode block's products (repro.decoding.decode_linear), CPU only: the routing rule; a batch-1 decode step and
a verify step over a few tokens whose every projection and head product, and each gated MLP's gate and up with its
gate in one call, goes through the kernels' entries (stand-ins here; the H200's engine self-check runs the Triton
kernels) with the logits of the model outside the block; and the Triton kernels themselves, plain and gated, against
an fp64 product under Triton's interpreter (on a GPU, compiled, on bf16 tensors).

    .venv/bin/python -m pytest -q tests/rollout/test_decode_linear.py
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from repro.decoding import decode_linear as dl
from repro.decoding.merged_projections import merged_projections
from repro.models.policy import build_policy

from .helpers import step_logits


@pytest.mark.timeout(30)
def test_cpu_tensors_take_f_linear():
    x, w, b = torch.randn(1, 8), torch.randn(5, 8), torch.randn(5)
    assert not dl.uses_gemv(x, w)
    torch.testing.assert_close(dl.decode_linear(x, w, b), F.linear(x, w, b), rtol=0, atol=0)
    if dl.gemv_triton is not None:                        # where Triton imports, the op is registered
        assert hasattr(torch.ops.repro, "gemv")


@pytest.mark.timeout(60)
@pytest.mark.timeout(30)
def test_rule_takes_few_rows_without_gradients(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))     # the rule, not the device
    if dl.gemv_triton is None:
        monkeypatch.setattr(dl, "gemv_triton", object())
    w, bf = torch.randn(5, 8), dict(dtype=torch.bfloat16)
    assert dl.uses_gemv(torch.randn(1, 8), w) and dl.uses_gemv(torch.randn(2, 8, 8, **bf), w.bfloat16())  # 16 rows
    assert not dl.uses_gemv(torch.randn(2, 8), w)                       # several fp32 rows: tf32 on tensor cores
    assert not dl.uses_gemv(torch.randn(17, 8, **bf), w.bfloat16())                          # too many rows
    assert not dl.uses_gemv(torch.randn(1, 8), w.T.contiguous().T)                           # column-major weight
    assert not dl.uses_gemv(torch.randn(1, 8, dtype=torch.float64), w.double())              # fp64
    assert not dl.uses_gemv(torch.randn(1, 8), w.clone().requires_grad_())                   # training: no backward
    with torch.no_grad():
        assert dl.uses_gemv(torch.randn(1, 8), w.clone().requires_grad_())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ids_shape", [(1, 1), (1, 5)], ids=["decode", "verify"])
def test_few_row_steps_route_every_product_through_the_kernel(monkeypatch, ids_shape):
    pol = build_policy("qwen3", "tiny", seed=4, init_std=0.2)
    calls = []

    def stand_in(x, w, bias):
        assert x.shape == (ids_shape[1], w.shape[1]) and x.is_contiguous()
        calls.append(tuple(w.shape))
        y = x.double() @ w.double().T + (bias.double() if bias is not None else 0)
        return y.to(x.dtype)

    def gated_stand_in(x, w):
        assert x.shape == (ids_shape[1], w.shape[1]) and x.is_contiguous()
        gated.append(tuple(w.shape))
        gate, up = (x.double() @ w.double().T).to(x.dtype).double().chunk(2, dim=-1)
        return (F.silu(gate) * up).to(x.dtype)

    gated = []
    monkeypatch.setattr(dl, "uses_gemv", lambda x, w: x.numel() <= dl.MAX_ROWS * x.shape[-1])
    monkeypatch.setattr(dl, "few_row_product", stand_in)
    monkeypatch.setattr(dl, "gated_product", gated_stand_in)
    ids = torch.randint(0, 127, ids_shape, generator=torch.Generator().manual_seed(0))
    want = step_logits(pol, ids)
    assert not calls and not gated                        # outside the block: the model's own modules
    with merged_projections(pol.model):
        layer = pol.decoder_layers()[0]
        assert type(layer.self_attn.o_proj) is dl.DecodeLinear and type(layer.mlp.down_proj) is dl.DecodeLinear
        got = step_logits(pol, ids)
        n_layers = len(pol.decoder_layers())
        assert len(calls) == 3 * n_layers + 1             # q/k/v, o, down per layer, and the head
        inter = pol.config.intermediate_size
        assert gated == [(2 * inter, pol.hidden_size)] * n_layers    # gate/up and the gate: one call per layer
        calls.clear()
        gated.clear()
        step_logits(pol, torch.randint(0, 127, (3, 6)))   # more than MAX_ROWS rows: F.linear
        assert not calls and not gated
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert type(pol.decoder_layers()[0].self_attn.o_proj) is nn.Linear and type(pol.model.lm_head) is nn.Linear


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rows", [1, 3, 8, 16])
def test_kernels_match_fp64(rows):
    """Under Triton's interpreter on CPU fp32 tensors, or compiled on a GPU's bf16 ones (to bf16's rounding)."""
    if dl.gemv_triton is None:
        pytest.skip("Triton does not import here")
    from triton_ir import kernel_check_setting
    device, dtype, rtol, atol = kernel_check_setting()
    gt = dl.gemv_triton
    g = torch.Generator().manual_seed(rows)
    n, k = 37, 200                                        # neither a multiple of the tiles
    x, w, b = (torch.randn(*s, generator=g).to(device, dtype) for s in ((rows, k), (n, k), (n,)))
    want = x.double() @ w.double().T + b.double()
    y = torch.full((rows, n), float("nan"), device=device, dtype=dtype)
    if rows == 1:
        gt.launch(x, w, b, y, block_n=4, block_k=64, num_warps=1)
    else:
        block_m = gt.row_tiles(rows, n, k)[0]
        assert block_m >= max(16, rows)
        gt.launch_rows(x, w, b, y, block_m=block_m, block_n=16, block_k=64, num_warps=1)
    torch.testing.assert_close(y.double(), want, rtol=rtol, atol=atol)
    if rows > 1:                                          # no bias; the tile the op picks
        y2 = torch.full((rows, n), float("nan"), device=device, dtype=dtype)
        block_m, block_n, block_k, _ = gt.row_tiles(rows, n, k)
        gt.launch_rows(x, w, None, y2, block_m=block_m, block_n=block_n, block_k=block_k, num_warps=1)
        torch.testing.assert_close(y2.double(), want - b.double(), rtol=rtol, atol=atol)
    # gated: w2 = [gate; up] (2n rows), y = silu(x @ gate.T) * (x @ up.T)
    w2 = torch.randn(2 * n, k, generator=g).to(device, dtype)
    gate, up = (x.double() @ w2.double().T).chunk(2, dim=-1)
    want_gated = F.silu(gate) * up
    y3 = torch.full((rows, n), float("nan"), device=device, dtype=dtype)
    if rows == 1:
        gt.launch(x, w2, None, y3, block_n=4, block_k=64, num_warps=1, gated=True)
    else:
        block_m, block_n, block_k, _ = gt.row_tiles(rows, n, k)
        gt.launch_rows(x, w2, None, y3, block_m=block_m, block_n=block_n, block_k=block_k, num_warps=1, gated=True)
    torch.testing.assert_close(y3.double(), want_gated, rtol=rtol, atol=atol)
    if device == "cuda":                                  # the ops, as the decode block calls them
        torch.testing.assert_close(torch.ops.repro.gemv(x, w, b).double(), want, rtol=rtol, atol=atol)
        torch.testing.assert_close(torch.ops.repro.gemv_silu_mul(x, w2).double(), want_gated, rtol=rtol, atol=atol)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("kernel", ["_gemv_kernel", "_rows_kernel"])
def test_kernels_build_for_sm90(kernel, gated):
    """The products' Triton IR for an sm90 target, plain and gated (what the interpreter does not check)."""
    from triton_ir import build_ir

    tiles = {"BLOCK_N": 4, "BLOCK_K": 1024} if kernel == "_gemv_kernel" else {"BLOCK_M": 16, "BLOCK_N": 16,
                                                                             "BLOCK_K": 512}
    run = build_ir("repro.decoding.gemv_triton", kernel, {"HAS_BIAS": False, "GATED": gated, **tiles})
    assert run.returncode == 0, run.stderr[-3000:]
