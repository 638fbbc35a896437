"""The candidate few-row kernel against fp64 (Triton's interpreter on CPU, as tests/rollout/test_decode_linear.py
runs the op's kernels), and its IR for an sm90 target."""
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rows", [1, 3, 5, 8])
def test_fma_kernel_matches_fp64(rows):
    from triton_ir import kernel_check_setting
    device, dtype, rtol, atol = kernel_check_setting()
    from studies.gemv.rows_fma import launch_fma
    g = torch.Generator().manual_seed(rows)
    n, k = 37, 200                                        # neither a multiple of the tiles
    x, w, b = (torch.randn(*s, generator=g).to(device, dtype) for s in ((rows, k), (n, k), (n,)))
    y = torch.full((rows, n), float("nan"), device=device, dtype=dtype)
    launch_fma(x, w, b, y, block_n=4, block_k=64, num_warps=1)
    torch.testing.assert_close(y.double(), x.double() @ w.double().T + b.double(), rtol=rtol, atol=atol)
    w2 = torch.randn(2 * n, k, generator=g).to(device, dtype)
    gate, up = (x.double() @ w2.double().T).chunk(2, dim=-1)
    y2 = torch.full((rows, n), float("nan"), device=device, dtype=dtype)
    launch_fma(x, w2, None, y2, block_n=8, block_k=128, num_warps=1, gated=True)
    torch.testing.assert_close(y2.double(), F.silu(gate) * up, rtol=rtol, atol=atol)


def test_fma_rows_are_checked():
    from studies.gemv.rows_fma import launch_fma
    x, w = torch.zeros(9, 16), torch.zeros(4, 16)
    with pytest.raises(ValueError, match=r"launch_fma takes 1 to 8 rows, got x of shape \(9, 16\)"):
        launch_fma(x, w, None, torch.empty(9, 4), block_n=4, block_k=16, num_warps=1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
def test_fma_kernel_builds_for_sm90(gated):
    from triton_ir import build_ir
    run = build_ir("studies.gemv.rows_fma", "_rows_fma_kernel",
                   {"HAS_BIAS": True, "GATED": gated, "BLOCK_M": 8, "BLOCK_N": 4, "BLOCK_K": 256})
    assert run.returncode == 0, run.stderr[-3000:]
