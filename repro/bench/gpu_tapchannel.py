"""The one GPU session of issue 4: TapChannel over CUDA IPC vs host staging on one GPU.

Runs, in order, writing everything under ``--out`` (the device tool's $OUT):
  1. gpu_env.json   torch/NCCL versions, the one-sided-transport probe, /dev/shm space, and the
                    measured ceilings: device-to-device copy bandwidth (bytes read + written, like
                    envcheck) and pinned host<->device bandwidth;
  2. gpu_tests.log  the GPU-marked transport tests (cuda_ipc and host_staging fan-in, bit-exact);
  3. fig7/          ``repro.bench.fig7`` with the h200 profile: 3 source processes + 1 draft process
                    on the one GPU (the PP=4 fan-in on one device), CUDA IPC vs host staging, with
                    bit-exact checks of the delivered taps before and after timing.
Prints a short table last.

    python -m repro.bench.gpu_tapchannel --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

os.environ.setdefault("WANDB_MODE", "disabled")  # the GPU image has no wandb; metrics.jsonl is the sidecar


def copy_bandwidth(nbytes: int = 2 << 30, repeats: int = 10) -> dict:
    """Device-to-device copy (GB/s counting read + write) and pinned D2H/H2D (GB/s, one way)."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    host = torch.empty(nbytes // 4, pin_memory=True)

    def timed(fn):
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        return sorted(times)[len(times) // 2]

    d2d = timed(lambda: dst.copy_(src))
    d2h = timed(lambda: host.copy_(src, non_blocking=True))
    h2d = timed(lambda: dst.copy_(host, non_blocking=True))
    out = {"bytes": nbytes, "d2d_copy_gbps_read_plus_write": 2 * nbytes / d2d / 1e9,
           "d2d_payload_gbps": nbytes / d2d / 1e9, "d2h_pinned_gbps": nbytes / d2h / 1e9,
           "h2d_pinned_gbps": nbytes / h2d / 1e9}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--tokens", type=int, nargs="+", default=None)
    ap.add_argument("--repeats", type=int, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_tapchannel needs a CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    from kernels.transport.probe import probe
    from repro.report.provenance import provenance, write_json_atomic

    env = {"probe": probe(), "device": torch.cuda.get_device_name(0),
           "dev_shm_free_gib": shutil.disk_usage("/dev/shm").free / 2**30,
           "ceilings": copy_bandwidth(), "provenance": provenance({})}
    torch.cuda.empty_cache()
    write_json_atomic(args.out / "gpu_env.json", env)
    print(json.dumps({k: env[k] for k in ("probe", "device", "dev_shm_free_gib", "ceilings")}, indent=1), flush=True)

    if not args.skip_tests:
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                              "tests/transport/test_multiprocess.py"], capture_output=True, text=True, timeout=300, check=False)
        (args.out / "gpu_tests.log").write_text(res.stdout + res.stderr)
        print("gpu tests:", res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr[-2000:],
              flush=True)

    from repro.bench.fig7 import config_for, run
    cfg = config_for("h200", {"tokens": args.tokens, "repeats": args.repeats})
    # /dev/shm must hold the host-staging rings (taps x depth x bytes); drop sizes that do not fit
    from dataclasses import replace

    from repro.bench.fig7 import fanin_layout
    free = shutil.disk_usage("/dev/shm").free * 0.9
    fits = [t for t in cfg.tokens if all(sum(r.tap.max_nbytes for r in fanin_layout(cfg, l, t).rings) * cfg.ring_depth
                                         < free for l in cfg.layouts)]
    if fits != list(cfg.tokens):
        print(f"/dev/shm ({free / 2**30:.1f} GiB usable) too small for T={sorted(set(cfg.tokens) - set(fits))}; "
              f"running T={fits}", flush=True)
        cfg = replace(cfg, tokens=tuple(fits))
    records = run(cfg, args.out / "fig7", "h200", timeout_s=480)
    ceil = env["ceilings"]["d2d_payload_gbps"]
    print(f"\ndevice copy: {env['ceilings']['d2d_copy_gbps_read_plus_write']:.0f} GB/s read+write "
          f"({ceil:.0f} GB/s payload)")
    print(f"{'layout':7} {'T':>6} {'transport':13} {'MB':>7} {'fan-in ms':>10} {'GB/s':>8} {'%copy':>6} "
          f"{'src %':>7} {'draft %':>8} {'all %':>7}")
    for r in records:
        print(f"{r['layout']:7} {r['tokens']:>6} {r['transport']:13} {r['bytes'] / 1e6:>7.0f} "
              f"{r['fanin_s'] * 1e3:>10.3f} {r['bandwidth_gbps']:>8.1f} {100 * r['bandwidth_gbps'] / ceil:>6.1f} "
              f"{r['source_slowdown_pct']:>7.2f} {r['draft_slowdown_pct']:>8.2f} {r['all_ranks_slowdown_pct']:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
