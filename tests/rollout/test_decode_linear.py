"""The decode block's products (repro.decoding.decode_linear), CPU only: the routing rule, and a batch-1 decode
step whose every projection and head product goes through the one-row kernel's entry (a stand-in here; the H200's
engine self-check runs the Triton kernel) with the logits of the model outside the block.

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
def test_one_row_steps_route_every_product_through_the_kernel(monkeypatch):
    pol = build_policy("qwen3", "tiny", seed=4, init_std=0.2)
    calls = []

    def stand_in(x, w, bias):
        assert x.shape == (1, w.shape[1]) and x.is_contiguous()
        calls.append(tuple(w.shape))
        y = x.double() @ w.double().T + (bias.double() if bias is not None else 0)
        return y.to(x.dtype)

    monkeypatch.setattr(dl, "uses_gemv", lambda x, w: x.numel() == x.shape[-1])
    monkeypatch.setattr(dl, "one_row_product", stand_in)
    ids = torch.randint(0, 127, (1, 1), generator=torch.Generator().manual_seed(0))
    want = step_logits(pol, ids)
    assert not calls                                      # outside the block: the model's own modules
    with merged_projections(pol.model):
        layer = pol.decoder_layers()[0]
        assert type(layer.self_attn.o_proj) is dl.DecodeLinear and type(layer.mlp.down_proj) is dl.DecodeLinear
        got = step_logits(pol, ids)
        n_layers = len(pol.decoder_layers())
        assert len(calls) == 4 * n_layers + 1             # q/k/v, gate/up, o, down per layer, and the head
        calls.clear()
        step_logits(pol, torch.randint(0, 127, (2, 3)))   # more than one row: F.linear
        assert not calls
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert type(pol.decoder_layers()[0].self_attn.o_proj) is nn.Linear and type(pol.model.lm_head) is nn.Linear
