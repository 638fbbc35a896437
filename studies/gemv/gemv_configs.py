"""Tile sizes of repro.decoding.gemv_triton on one GPU: every config against cuBLAS (F.linear) on the h200 policy's
projection shapes for one row, then the few-rows kernel's configs for 5 and 16 rows (a batch-1 verify step, a
prefill), timed as CUDA-graph replays (what the decode engine runs) and checked against an fp32 product; then the op
with its chosen tiles. Prints the best config per shape and its copy rate; writes nothing. ``--gated``: only the
gated gate/up kernel (silu(gate) * up in the product's launch) against the unfused op and its gate, 1 and 8 rows.
``--fma``: only the candidate CUDA-core few-row kernel (``rows_fma.py``) at 2, 5 and 8 rows against the op (the
tensor-core kernel) at those rows and the op at one row (what a verify step's products would cost if k + 1 rows
were as cheap as one). ``--splitk``: only the candidate split-K few-row kernel (``rows_splitk.py``) on the narrow
shapes (o, down, head) at 2, 5 and 9 rows, against the same two.

    PYTHONPATH=. python studies/gemv/gemv_configs.py        # on a CUDA machine with Triton
    PYTHONPATH=. python studies/gemv/gemv_configs.py --gated
    PYTHONPATH=. python studies/gemv/gemv_configs.py --fma
    PYTHONPATH=. python studies/gemv/gemv_configs.py --splitk
"""
import itertools
import sys

import torch
import torch.nn.functional as F
import triton.testing

from repro.decoding.gemv_triton import gemv, gemv_silu_mul, launch, launch_rows

SHAPES = {"qkv": (4096, 1024), "gate_up": (6144, 1024), "o": (1024, 2048), "down": (1024, 3072), "head": (512, 1024)}
CONFIGS = list(itertools.product((4, 8, 16, 32), (256, 512, 1024), (4, 8)))
ROW_CONFIGS = list(itertools.product((16, 32), (128, 256, 512), (4, 8), (3, 5)))   # block_n, block_k, warps, stages


def graph_time_us(fn) -> float:
    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=30)


def excess_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |y - ref| over its tolerance: 5e-2 absolute plus two bf16 ulps of ``ref`` (2^-7 relative), so that
    outputs of magnitude 8-16, where one ulp is 0.0625, pass when they are one rounding away."""
    return ((y.float() - ref.float()).abs() / (5e-2 + 2.0 ** -7 * ref.float().abs())).max().item()


def best_config(configs, call_for, y, ref, what: str, after_timing=None) -> tuple[float, tuple]:
    """(time in us, config) of the fastest of ``configs``. ``call_for(config)`` is the call to time, writing ``y``;
    before its timing each config's output is checked against ``ref`` (``y`` set to NaN first, so an output the
    call leaves unwritten fails), and ``after_timing(config)``, if given, checks what the replays left."""
    best = None
    for config in configs:
        run = call_for(config)
        y.fill_(float("nan"))
        run()
        err = excess_error(y, ref)
        assert err <= 1, f"{what} {config}: error {err:.3g} of the tolerance"
        t = graph_time_us(run)
        if after_timing is not None:
            after_timing(config)
        if best is None or t < best[0]:
            best = (t, config)
    return best


def main():
    torch.manual_seed(0)
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ w.float().T
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        best = best_config(CONFIGS, lambda c: lambda: launch(x, w, None, y, block_n=c[0], block_k=c[1],
                                                             num_warps=c[2]), y, ref, name)
        err = (gemv(x, w).float() - ref).abs().max().item()
        t_op, t_cublas = graph_time_us(lambda: gemv(x, w)), graph_time_us(lambda: F.linear(x, w))
        gbs = lambda t: n * k * 2 / t / 1e3
        print(f"{name:8s} n={n} k={k}: cuBLAS {t_cublas:6.2f} us ({gbs(t_cublas):5.0f} GB/s)  op {t_op:6.2f} us "
              f"({gbs(t_op):5.0f} GB/s, error {err:.2g})  best {best[1]} {best[0]:6.2f} us", flush=True)


def rows_sweep():
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        for rows in (5, 16):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ w.float().T
            y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
            best = best_config(ROW_CONFIGS, lambda c: lambda: launch_rows(
                x, w, None, y, block_m=16, block_n=c[0], block_k=c[1], num_warps=c[2], num_stages=c[3]),
                y, ref, f"{name} rows {rows}")
            t_op, t_cublas = graph_time_us(lambda: gemv(x, w)), graph_time_us(lambda: F.linear(x, w))
            print(f"{name:8s} rows {rows:2d}: cuBLAS {t_cublas:6.2f} us  op {t_op:6.2f} us  best (block_n, block_k, "
                  f"warps, stages) {best[1]} {best[0]:6.2f} us ({n * k * 2 / best[0] / 1e3:5.0f} GB/s)", flush=True)


def gated_sweep():
    n, k = SHAPES["gate_up"]
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    for rows in (1, 8):
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(rows, n // 2, device="cuda", dtype=torch.bfloat16)

        def unfused():
            gate, up = gemv(x, w).split(n // 2, dim=-1)
            return F.silu(gate) * up

        ref = unfused().float()
        configs = (itertools.product((2, 4, 8), (512, 1024), (4, 8), (3,)) if rows == 1
                   else itertools.product((16, 32), (128, 256, 512), (4, 8), (3,)))
        if rows == 1:
            call_for = lambda c: lambda: launch(x, w, None, y, block_n=c[0], block_k=c[1], num_warps=c[2], gated=True)
        else:
            call_for = lambda c: lambda: launch_rows(x, w, None, y, block_m=16, block_n=c[0], block_k=c[1],
                                                     num_warps=c[2], num_stages=c[3], gated=True)
        best = best_config(configs, call_for, y, ref, f"gated rows {rows}")
        t_op, t_unfused = graph_time_us(lambda: gemv_silu_mul(x, w)), graph_time_us(unfused)
        print(f"gated rows {rows:2d}: unfused (op + gate) {t_unfused:6.2f} us  gated op {t_op:6.2f} us  best "
              f"(block_n, block_k, warps, stages) {best[1]} {best[0]:6.2f} us", flush=True)


def candidate_cases(names, row_counts):
    """The cases a few-row candidate kernel is timed on: for each shape in ``names`` and each row count, (name,
    rows, x, w, y, fp32 reference, the op's time for one row of that shape)."""
    for name in names:
        n, k = SHAPES[name]
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        x1 = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        t_one = graph_time_us(lambda: gemv(x1, w))
        for rows in row_counts:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
            yield name, rows, x, w, y, x.float() @ w.float().T, t_one


FMA_CONFIGS = list(itertools.product((2, 4, 8), (128, 256, 512), (4, 8)))    # block_n, block_k, warps


def fma_sweep():
    from studies.gemv.rows_fma import launch_fma
    for name, rows, x, w, y, ref, t_one in candidate_cases(SHAPES, (2, 5, 8)):
        best = best_config(FMA_CONFIGS, lambda c: lambda: launch_fma(x, w, None, y, block_n=c[0], block_k=c[1],
                                                                     num_warps=c[2]), y, ref, f"{name} rows {rows}")
        t_op = graph_time_us(lambda: gemv(x, w))
        print(f"{name:8s} rows {rows}: op at one row {t_one:6.2f} us  op (tensor cores) {t_op:6.2f} us  fma best "
              f"(block_n, block_k, warps) {best[1]} {best[0]:6.2f} us", flush=True)


SPLITK_CONFIGS = list(itertools.product((16, 32), (128, 256, 512), (2, 4, 8)))    # block_n, block_k, split_k


def splitk_sweep():
    from studies.gemv.rows_splitk import LOCK_SLOTS, launch_splitk
    lock = torch.zeros(LOCK_SLOTS, dtype=torch.int32, device="cuda")
    for name, rows, x, w, y, ref, t_one in candidate_cases(("o", "down", "head"), (2, 5, 9)):

        def counters_zeroed(c):
            assert lock.count_nonzero().item() == 0, f"{name} {c}: counters left set"

        best = best_config(SPLITK_CONFIGS, lambda c: lambda: launch_splitk(
            x, w, None, y, lock, block_n=c[0], block_k=c[1], split_k=c[2], num_warps=4),
            y, ref, f"{name} rows {rows}", after_timing=counters_zeroed)
        y.fill_(float("nan"))
        bn, bk, split = best[1]
        launch_splitk(x, w, None, y, lock, block_n=bn, block_k=bk, split_k=split, num_warps=4)
        assert excess_error(y, ref) <= 1, f"{name} rows {rows}: the best config's output after its timing"
        t_op = graph_time_us(lambda: gemv(x, w))
        print(f"{name:8s} rows {rows}: op at one row {t_one:6.2f} us  op (tensor cores) {t_op:6.2f} us  split-K "
              f"best (block_n, block_k, split_k) {best[1]} {best[0]:6.2f} us", flush=True)


if __name__ == "__main__":
    if "--splitk" in sys.argv[1:]:
        splitk_sweep()
        sys.exit(0)
    if "--fma" in sys.argv[1:]:
        fma_sweep()
        sys.exit(0)
    if "--gated" in sys.argv[1:]:
        gated_sweep()
        sys.exit(0)
    if "--rows-only" not in sys.argv[1:]:
        main()
    rows_sweep()
