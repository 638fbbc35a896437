"""envcheck: record this machine and measure its ceilings (matmul FLOP/s, copy bandwidth, GPU-to-GPU bandwidth).

The comparison reports divide the paper hardware's datasheet ceilings by these measured ones to
print an "expected ratio" next to every measured ratio; the decode benchmark draws its floor from the copy
bandwidth. Writes, in the run folder, bench.json: provenance (detected CPU/GPUs, versions, git), the raw samples
of every measurement, and ``summary.ceilings``; the values also go through the suite's metrics logger.

    python -m repro.bench.envcheck --profile cpu-tiny --out results/<machine>/cpu-tiny/envcheck
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from repro.core.profile import load_profile
from repro.core.provenance import hardware
from repro.core.timing import BenchRun, summarize, time_samples

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def matmul_tflops(n: int, dtype: torch.dtype, device: torch.device, repeats: int) -> list[float]:
    """Seconds per n x n x n product on random data (never zeros: they run faster than real data)."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    return time_samples(lambda: torch.mm(a, b), warmup=2, repeats=repeats, device=device)


def copy_seconds(megabytes: int, device: torch.device, repeats: int) -> tuple[list[float], int]:
    """Seconds per device-to-device copy of ``megabytes``; bytes moved counts read + write."""
    n = megabytes * 2**20 // 4
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    return time_samples(lambda: dst.copy_(src), warmup=2, repeats=repeats, device=device), 2 * n * 4


def p2p_seconds(megabytes: int, repeats: int) -> tuple[list[float], int]:
    """Seconds per GPU0 -> GPU1 copy (only with 2+ GPUs)."""
    n = megabytes * 2**20 // 4
    src = torch.rand(n, device="cuda:0")
    dst = torch.empty(n, device="cuda:1")
    samples = []
    for i in range(repeats + 2):
        torch.cuda.synchronize("cuda:0")
        torch.cuda.synchronize("cuda:1")
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(torch.cuda.current_stream("cuda:0"))
        dst.copy_(src, non_blocking=True)
        end.record(torch.cuda.current_stream("cuda:0"))
        torch.cuda.synchronize("cuda:1")
        end.synchronize()
        if i >= 2:
            samples.append(start.elapsed_time(end) / 1e3)
    return samples, n * 4


def run(profile_name: str, out: Path) -> dict:
    profile = load_profile(profile_name)
    cfg = profile["envcheck"]
    device = torch.device("cuda" if profile["hardware"]["device"] == "cuda" and torch.cuda.is_available()
                          else "cpu")
    dtype = DTYPES[profile["dtype"]]
    if device.type == "cpu" and dtype != torch.float32:
        dtype = torch.float32   # CPU ceilings are measured in fp32 whatever the profile asks for
    config = {"profile": profile["name"], "device": str(device), "dtype": str(dtype).replace("torch.", ""), **cfg}
    ceilings: dict[str, float | str | None] = {"dtype": config["dtype"], "device": device.type}
    with BenchRun(out, artifact="envcheck", profile=profile["name"], config=config) as bench:
        n = cfg["matmul_size"]
        samples = matmul_tflops(n, dtype, device, cfg["matmul_repeats"])
        flops = 2 * n**3
        rec = bench.record("matmul", {"n": n, "dtype": config["dtype"]}, samples,
                           extra={"matmul_tflops": flops / summarize(samples)["median"] / 1e12})
        ceilings["matmul_tflops"] = rec["metrics"]["matmul_tflops"]
        samples, nbytes = copy_seconds(cfg["copy_mb"], device, cfg["copy_repeats"])
        rec = bench.record("copy", {"megabytes": cfg["copy_mb"], "bytes_counted": nbytes}, samples,
                           extra={"copy_bw_gbps": nbytes / summarize(samples)["median"] / 1e9})
        ceilings["copy_bw_gbps"] = rec["metrics"]["copy_bw_gbps"]
        ceilings["p2p_bw_gbps"] = None
        if device.type == "cuda" and torch.cuda.device_count() >= 2:
            samples, nbytes = p2p_seconds(cfg["copy_mb"], cfg["copy_repeats"])
            rec = bench.record("p2p", {"megabytes": cfg["copy_mb"]}, samples,
                               extra={"p2p_bw_gbps": nbytes / summarize(samples)["median"] / 1e9})
            ceilings["p2p_bw_gbps"] = rec["metrics"]["p2p_bw_gbps"]
        bench.summary["ceilings"] = ceilings
    return json.loads((out / "bench.json").read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Record the machine and measure its ceilings.")
    ap.add_argument("--profile", default="cpu-tiny", help="hardware profile (default: cpu-tiny)")
    ap.add_argument("--out", type=Path, default=None,
                    help="run folder (default: results/<hw>/<profile>/envcheck)")
    args = ap.parse_args(argv)
    out = args.out or Path("results") / hardware()["tag"] / args.profile / "envcheck"
    env = run(args.profile, out)
    print(json.dumps({"hardware": env["provenance"]["hardware"]["tag"], **env["summary"]["ceilings"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
