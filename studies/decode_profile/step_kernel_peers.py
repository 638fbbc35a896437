"""The decode step's two Triton kernels against what they replace, on one GPU, at the h200 policy's shapes: the
few-row products (``torch.ops.repro.gemv``, 1-16 rows) against cuBLAS (``F.linear``), and the grouped decode
attention (``kernels.attention.decode_triton``) against SDPA's masked kernel with the grouped heads folded
(``grouped_sdpa(impl="sdpa")``), each checked against an fp32 product and timed as CUDA-graph replays. Prints;
writes nothing (the decode benchmark, ``snakemake decode``, is where results come from).

    PYTHONPATH=. python studies/decode_profile/step_kernel_peers.py
"""
import torch
import torch.nn.functional as F

from kernels.attention.grouped import grouped_sdpa
from repro.decoding import gemv_triton  # noqa: F401  (registers torch.ops.repro.gemv)
from studies.gemv.gemv_configs import graph_time_us as graph_us

SHAPES = {"qkv": (4096, 1024), "gate_up": (6144, 1024), "o": (1024, 2048), "down": (1024, 3072)}


def products():
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        for rows in (1, 2, 5, 8, 16):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            err = (torch.ops.repro.gemv(x, w).float() - x.float() @ w.float().T).abs().max().item()
            ours, cublas = graph_us(lambda: torch.ops.repro.gemv(x, w)), graph_us(lambda: F.linear(x, w))
            print(f"gemv {name:8s} rows {rows:2d}: ours {ours:6.2f} us ({n * k * 2 / ours / 1e3:5.0f} GB/s)  "
                  f"cuBLAS {cublas:6.2f} us  x{cublas / ours:4.2f}  error {err:.2g}", flush=True)


def attention():
    H, G, D = 16, 8, 128
    for B, Q, S in ((1, 1, 96), (1, 5, 96), (1, 8, 96), (64, 1, 96), (64, 5, 96), (64, 8, 96), (1, 5, 1024),
                    (64, 5, 1024), (256, 5, 512)):
        q = torch.randn(B, Q, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        k, v = (torch.randn(B, G, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        vis = torch.rand(B, 1, Q, S, device="cuda") < 0.8
        vis[..., 0] = True
        mask = torch.zeros(B, 1, Q, S, device="cuda", dtype=torch.bfloat16).masked_fill(~vis, -3.0e38)
        ref = grouped_sdpa(q.float(), k.float(), v.float(), mask.float(), impl="sdpa")
        err = (grouped_sdpa(q, k, v, mask).float() - ref).abs().max().item()
        ours = graph_us(lambda: grouped_sdpa(q, k, v, mask).transpose(1, 2).contiguous())
        sdpa = graph_us(lambda: grouped_sdpa(q, k, v, mask, impl="sdpa").transpose(1, 2).contiguous())
        print(f"attention B {B:3d} q {Q} S {S:4d}: ours {ours:6.2f} us  SDPA {sdpa:6.2f} us  x{sdpa / ours:4.2f}  "
              f"error {err:.2g}", flush=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    products()
    attention()
