"""GPU self-check of TapChannel's p2p transport over NCCL: PP-1 sources fan in to the draft's rank,
one process per GPU, every tap compared bit for bit with what was put; a verdict table and JSON.

NCCL refuses two ranks on one device, so this needs at least 2 GPUs (PP = 2); with 4 or more it also
runs PP = 4. On fewer it writes a 'not run' verdict naming why and exits 3.

    python -m kernels.transport.selfcheck_p2p --out p2p_nccl.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib

import torch

from kernels.launch import spawn
from kernels.transport import ChannelLayout, TapChannel, TapSpec, sequence_stamp

N_MB, STEPS, HIDDEN, ROWS = 4, 3, 1024, 512


def _layout(world: int) -> ChannelLayout:
    taps = {0: [TapSpec("embed", (ROWS, HIDDEN), torch.bfloat16), TapSpec("L1", (ROWS, HIDDEN), torch.bfloat16)]}
    for s in range(1, world - 1):
        taps[s] = [TapSpec(f"L{4 * s + 1}", (ROWS, HIDDEN), torch.bfloat16)]
    return ChannelLayout(sources=taps, stage_to_rank={s: s for s in range(world)}, consumer_rank=world - 1,
                         ring_depth=2)


def _value(stage: int, name: str, seq: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{stage}/{name}/{seq}".encode()))
    rows = ROWS // 2 + (seq * 37 + stage) % (ROWS // 2)
    return torch.randn(rows, HIDDEN, generator=g).to(torch.bfloat16).to(device)


def _worker(rank: int, world: int) -> dict:
    device = torch.device("cuda", torch.cuda.current_device())
    lay = _layout(world)
    ch = TapChannel.setup(lay, "p2p", backend="nccl", device=device, get_timeout_s=60, put_timeout_s=60)
    bad, t0 = 0, time.perf_counter()
    for step in range(STEPS):
        for mb in range(N_MB):
            seq = sequence_stamp(step, mb, N_MB)
            for spec in lay.sources.get(rank, []):
                ch.put(rank, spec.name, seq, _value(rank, spec.name, seq, device))
            if rank == lay.consumer_rank:
                for stage in lay.sources:
                    for name, got in ch.get_stage(stage, seq).items():
                        bad += not torch.equal(got, _value(stage, name, seq, device))
                    ch.release(stage, seq)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    rep = ch.report()
    ch.close()
    return {"rank": rank, "mismatches": bad, "elapsed_s": elapsed, "report": rep}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="p2p_nccl.json")
    args = ap.parse_args(argv)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    rows = []
    for world in (2, 4):
        if gpus < world:
            rows.append({"pp": world, "verdict": "not run", "why": f"NCCL needs one GPU per rank; {gpus} GPU(s) here"})
            continue
        try:
            out = spawn(_worker, world, timeout_s=300, backend="nccl")
            bad = out[-1]["mismatches"]
            rows.append({"pp": world, "verdict": "pass" if bad == 0 else "FAIL", "mismatches": bad,
                         "gets": out[-1]["report"]["get"]["bytes"]["n"], "elapsed_s": out[-1]["elapsed_s"]})
        except Exception as exc:  # noqa: BLE001 - the verdict names the failure
            rows.append({"pp": world, "verdict": "FAIL", "why": f"{type(exc).__name__}: {exc}"[:2000]})
    with open(args.out + ".tmp", "w") as f:
        json.dump({"check": "p2p over NCCL", "torch": torch.__version__, "gpus": gpus, "rows": rows}, f, indent=2)
    os.replace(args.out + ".tmp", args.out)
    print(f"{'PP':>3}  verdict   detail")
    for r in rows:
        print(f"{r['pp']:>3}  {r['verdict']:8s}  {r.get('why') or r.get('mismatches')}")
    if any(r["verdict"] == "FAIL" for r in rows):
        return 1
    return 0 if any(r["verdict"] == "pass" for r in rows) else 3


if __name__ == "__main__":
    sys.exit(main())
