"""Index tensors and block-sparsity tables built on the host: their values, layout and where they end up.

Run: .venv/bin/python -m pytest -q tests/attention/test_host_tables.py
"""
import pytest
import torch

from kernels.attention.backends.intervals import ordered
from kernels.attention.fused_block import block_problem
from kernels.attention.spec import MaskSpec
from kernels.attention.staging import to_device

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("shape", [(5, 9), (1, 1, 7, 3), (4, 0)])
def test_ordered_puts_true_columns_first_in_order(shape):
    m = torch.rand(*shape, generator=torch.Generator().manual_seed(0)) > 0.5
    for x in (m, m.transpose(-1, -2)):
        cnt, idx = ordered(x)
        ref = torch.argsort((~x).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        assert torch.equal(idx, ref) and torch.equal(cnt, x.sum(-1, dtype=torch.int32))
        assert idx.is_contiguous() and cnt.is_contiguous() and idx.dtype == cnt.dtype == torch.int32


def test_to_device_converts_and_copies():
    t = torch.arange(5)
    out = to_device(t, "cpu", torch.int32)
    assert out.dtype == torch.int32 and torch.equal(out.long(), t)
    assert to_device(t, "meta").device.type == "meta"


def test_prefix_spec_keeps_key_end_on_the_host():
    spec = MaskSpec.prefix(torch.tensor([0, 3]), torch.tensor([0, 4]), torch.tensor([1, 2, 4], dtype=torch.int32))
    assert spec.key_end.device.type == "cpu" and spec.key_end.dtype == torch.int64 and spec.pairs() == 7


def test_block_problem_built_on_the_host_lands_on_the_kernels_device():
    lo, hi = torch.zeros(1, 3, dtype=torch.long), torch.tensor([[0, 5, 9]])
    sv, bv = torch.ones(1, 12, dtype=torch.bool), torch.tensor([[True, True, False]])
    here = block_problem(lo, hi, sv, bv, 4, 10)
    there = block_problem(lo, hi, sv, bv, 4, 10, device="meta")
    assert all(a.device.type == "meta" for a in there.aux) and there.empty_rows.device.type == "meta"
    assert all(p.device.type == "cpu" for pair in there.pairs for p in pair)      # tables are built on the host
    assert [a.shape for a in here.aux] == [a.shape for a in there.aux]
    assert torch.equal(here.empty_rows, torch.arange(8, 12))                      # the invalid block's rows
