"""The split-K candidate against fp64 (Triton's interpreter on CPU), with the counters left zeroed for the next call,
and its IR for an sm90 target."""
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rows,split_k", [(1, 2), (5, 3), (9, 4), (16, 8)])
def test_splitk_kernel_matches_fp64(rows, split_k):
    from triton_ir import kernel_check_setting
    device, dtype, rtol, atol = kernel_check_setting()
    from studies.gemv.rows_splitk import launch_splitk
    g = torch.Generator().manual_seed(rows)
    n, k = 37, 200          # neither a multiple of the tiles; at 8 slices of 32 the last two slices are empty
    x, w, b = (torch.randn(*s, generator=g).to(device, dtype) for s in ((rows, k), (n, k), (n,)))
    lock = torch.zeros(8, dtype=torch.int32, device=device)
    for bias in (b, None):                                # twice on one lock: the first call must leave it zeroed
        y = torch.full((rows, n), float("nan"), device=device, dtype=dtype)
        launch_splitk(x, w, bias, y, lock, block_n=16, block_k=32, split_k=split_k, num_warps=1)
        ref = x.double() @ w.double().T + (bias.double() if bias is not None else 0)
        torch.testing.assert_close(y.double(), ref, rtol=rtol, atol=atol)
        assert lock.count_nonzero().item() == 0


def test_splitk_arguments_are_checked():
    from studies.gemv.rows_splitk import launch_splitk
    x, w = torch.zeros(17, 16), torch.zeros(40, 16)
    with pytest.raises(ValueError, match=r"launch_splitk takes 1 to 16 rows, got x of shape \(17, 16\)"):
        launch_splitk(x, w, None, torch.empty(17, 40), torch.zeros(4, dtype=torch.int32), block_n=16, block_k=16,
                      split_k=2, num_warps=1)
    with pytest.raises(ValueError, match=r"needs an int32 lock of at least 3 slots, got torch.int32 of 2"):
        launch_splitk(x[:2], w, None, torch.empty(2, 40), torch.zeros(2, dtype=torch.int32), block_n=16,
                      block_k=16, split_k=2, num_warps=1)


@pytest.mark.timeout(120)
def test_splitk_kernel_builds_for_sm90():
    from triton_ir import build_ir
    run = build_ir("studies.gemv.rows_splitk", "_rows_splitk_kernel",
                   {"HAS_BIAS": True, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_K": 4},
                   types={"part_ptr": "*fp32", "lock_ptr": "*i32"})
    assert run.returncode == 0, run.stderr[-3000:]
