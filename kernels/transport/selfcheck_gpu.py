"""GPU self-check of TapChannel's device transports; a verdict table and JSON from one call.

Fan-in cases: PP-1 source processes put their taps (bf16, variable length) for 3 steps x 4 microbatches into
depth-2 rings, the draft's process reads them behind a deliberate delay (so every source must wait for
credits), and every tap is compared bit for bit with what was put.

  cuda_ipc      PP=2 and PP=4, process r on GPU r % n (on one GPU all processes share it)
  cuda_ipc      PP=2 with the draft on GPU 1 and its source on GPU 0 (peer copies into the arena; 2 GPUs)
  host_staging  PP=4 on the GPU(s) (the baseline's device legs)
  p2p           PP=2 and PP=4 over NCCL, one GPU per process (NCCL refuses two ranks on one GPU)

plus the CUDA IPC handshake on a real device arena: a source maps the draft's arena and writes its slots, and
refuses an offer for another layout and one naming another GPU. Cases this machine cannot run are listed
as 'not run' with the reason. Exit code: 1 if any case failed, 3 if none could run, else 0.

    python -m kernels.transport.selfcheck_gpu --out transport_gpu.json
    python -m kernels.transport.selfcheck_gpu --only p2p --out p2p_nccl.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kernels.launch import spawn
from kernels.transport import ChannelLayout, TapChannel, TapChannelError, TapSpec, sequence_stamp

N_MB, STEPS, HIDDEN, ROWS, DEPTH = 4, 3, 1024, 512, 2
CONSUMER_DELAY_S = 0.02      # the draft reads late: sources two microbatches ahead wait for credit


@dataclass(frozen=True)
class Case:
    name: str
    transport: str
    pp: int
    placement: str           # "shared": process r on GPU r % n; "apart": draft on GPU 1, sources on GPU 0;
    #                          "own": process r on GPU r (NCCL)
    kind: str = "fanin"      # or "handshake"

    def gpus(self, n_gpus: int) -> list[int]:
        if self.placement == "apart":
            return [1 if r == self.pp - 1 else 0 for r in range(self.pp)]
        return [r % n_gpus for r in range(self.pp)]

    def why_not(self, n_gpus: int) -> str | None:
        if n_gpus == 0:
            return "no CUDA device"
        if self.placement == "apart" and n_gpus < 2:
            return f"needs 2 GPUs (the draft on another GPU than its source); {n_gpus} here"
        if self.placement == "own" and n_gpus < self.pp:
            return f"NCCL needs one GPU per rank: PP={self.pp} needs {self.pp} GPUs; {n_gpus} here"
        return None


CASES = (Case("cuda_ipc PP=2", "cuda_ipc", 2, "shared"), Case("cuda_ipc PP=4", "cuda_ipc", 4, "shared"),
         Case("cuda_ipc PP=2, draft on its own GPU", "cuda_ipc", 2, "apart"),
         Case("cuda_ipc handshake", "cuda_ipc", 2, "shared", kind="handshake"),
         Case("host_staging PP=4", "host_staging", 4, "shared"),
         Case("p2p/NCCL PP=2", "p2p", 2, "own"), Case("p2p/NCCL PP=4", "p2p", 4, "own"))


def fanin_layout(world: int) -> ChannelLayout:
    taps = {0: [TapSpec("embed", (ROWS, HIDDEN), torch.bfloat16),
                TapSpec("L1", (ROWS, HIDDEN), torch.bfloat16)]}
    for s in range(1, world - 1):
        taps[s] = [TapSpec(f"L{4 * s + 1}", (ROWS, HIDDEN), torch.bfloat16)]
    return ChannelLayout(sources=taps, stage_to_rank={s: s for s in range(world)}, consumer_rank=world - 1,
                         ring_depth=DEPTH)


def tap_value(stage: int, name: str, seq: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{stage}/{name}/{seq}".encode()))
    rows = ROWS // 2 + (seq * 37 + stage) % (ROWS // 2)
    return torch.randn(rows, HIDDEN, generator=g).to(torch.bfloat16).to(device)


def fanin_worker(rank: int, world: int, case: Case, gpus: list[int]) -> dict:
    torch.cuda.set_device(gpus[rank])
    device = torch.device("cuda", gpus[rank])
    lay = fanin_layout(world)
    backend = "nccl" if case.transport == "p2p" else "gloo"
    ch = TapChannel.setup(lay, case.transport, backend=backend, device=device, get_timeout_s=60,
                          put_timeout_s=60)
    bad, t0 = 0, time.perf_counter()
    for step in range(STEPS):
        for mb in range(N_MB):
            seq = sequence_stamp(step, mb, N_MB)
            for spec in lay.sources.get(rank, []):
                ch.put(rank, spec.name, seq, tap_value(rank, spec.name, seq, device))
            if rank == lay.consumer_rank:
                time.sleep(CONSUMER_DELAY_S)
                for stage in lay.sources:
                    for name, got in ch.get_stage(stage, seq).items():
                        bad += not torch.equal(got, tap_value(stage, name, seq, device))
                    ch.release(stage, seq)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    rep = ch.report()
    ch.close()
    return {"rank": rank, "gpu": gpus[rank], "mismatches": bad, "elapsed_s": elapsed, "report": rep}


def handshake_worker(rank: int, world: int, case: Case, gpus: list[int]) -> dict:
    """Rank 1 offers a CUDA arena; rank 0 maps it and fills its slots, then tries two bad offers."""
    from kernels.transport.transports.base import arena_offsets, broadcast_object, slot_view
    from kernels.transport.transports.cuda_ipc import accept_arena, offer_arena
    torch.cuda.set_device(gpus[rank])
    device = torch.device("cuda", gpus[rank])
    lay = fanin_layout(world)
    offsets, size = arena_offsets(lay)
    offers, arena, out = None, None, {"rank": rank}
    if rank == lay.consumer_rank:
        arena = torch.zeros(size, dtype=torch.uint8, device=device)
        # one offer to map, one to tamper with: each pickle carries its own share of the reference count
        offers = (offer_arena(arena, None, lay), offer_arena(arena, None, lay))
    offer, spare = broadcast_object(offers, src=lay.consumer_rank, group=dist.group.WORLD)
    if rank != lay.consumer_rank:
        mapped = accept_arena(offer, lay, rank)
        out["mapped_on"] = str(mapped.device)
        for r in lay.rings_of_stage(rank):
            for s in range(lay.ring_depth):
                slot_view(mapped, offsets[(r.index, s)], r).fill_(r.index + s + 1)
        torch.cuda.synchronize()
        other = dataclasses.replace(lay, ring_depth=DEPTH + 1)
        refusals = {}
        elsewhere = dataclasses.replace(spare, device_uuid="GPU-not-this")
        for what, bad_layout, bad_offer in (("layout", other, offer), ("device", lay, elsewhere)):
            try:
                accept_arena(bad_offer, bad_layout, rank)
                refusals[what] = "accepted"
            except TapChannelError as exc:
                refusals[what] = str(exc)
        out["refusals"] = refusals
        del mapped
    dist.barrier()
    if rank == lay.consumer_rank:
        out["slots_ok"] = all(bool(torch.all(slot_view(arena, offsets[(r.index, s)], r) == r.index + s + 1))
                              for r in lay.rings for s in range(lay.ring_depth))
    return out


def run_case(case: Case, n_gpus: int, timeout_s: float = 120.0) -> dict:
    row = {"case": case.name, "transport": case.transport, "pp": case.pp, "placement": case.placement}
    why = case.why_not(n_gpus)
    if why:
        return {**row, "verdict": "not run", "why": why}
    gpus = case.gpus(n_gpus)
    row["gpus"] = gpus
    t0 = time.perf_counter()
    try:
        if case.kind == "handshake":
            out = spawn(handshake_worker, case.pp, args=(case, gpus), timeout_s=timeout_s, backend="gloo")
            ref = out[0]["refusals"]
            problems = [f"{k} offer {v}" for k, v in ref.items() if v == "accepted"]
            if not out[-1]["slots_ok"]:
                problems.append("the source's writes did not land in the draft's slots")
            if "different ChannelLayouts" not in ref["layout"] or "CUDA_VISIBLE_DEVICES" not in ref["device"]:
                problems.append(f"refusals do not name the cause: {ref}")
            row.update(mapped_on=out[0]["mapped_on"], refusals=ref)
        else:
            out = spawn(fanin_worker, case.pp, args=(case, gpus), timeout_s=timeout_s,
                        backend="nccl" if case.transport == "p2p" else "gloo")
            lay, draft = fanin_layout(case.pp), out[-1]
            want = STEPS * N_MB * len(lay.rings)
            got = draft["report"]["get"]["bytes"]["n"]
            waits = [r["report"]["put"]["credit_wait_s"]["max"] for r in out[:-1]]
            problems = []
            if draft["mismatches"]:
                problems.append(f"{draft['mismatches']} of {want} taps differ from what was put")
            if got != want:
                problems.append(f"{got} gets, expected {want}")
            if min(waits) < CONSUMER_DELAY_S / 4:
                problems.append(f"a source never waited for credit behind the slow draft (longest waits "
                                f"{waits} s; the draft reads {CONSUMER_DELAY_S} s late per microbatch)")
            row.update(mismatches=draft["mismatches"], gets=got, max_credit_wait_s=waits,
                       bytes=draft["report"]["get"]["bytes"]["sum"], elapsed_s=draft["elapsed_s"])
        row.update(verdict="FAIL" if problems else "pass", why="; ".join(problems) or None)
    except Exception as exc:  # noqa: BLE001 - the verdict names the failure
        row.update(verdict="FAIL", why=f"{type(exc).__name__}: {exc}"[:3000])
    row["wall_s"] = time.perf_counter() - t0
    return row


def environment() -> dict:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": []}
    if torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:  # noqa: BLE001 - informational
            env["nccl"] = f"unavailable: {exc}"
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="transport_gpu.json", help="JSON report (written atomically)")
    ap.add_argument("--only", choices=sorted({c.transport for c in CASES}), default=None,
                    help="run the cases of one transport")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds per case before its processes are killed (a hang is a FAIL)")
    args = ap.parse_args(argv)
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    rows = []
    for case in CASES:
        if args.only and case.transport != args.only:
            continue
        rows.append(run_case(case, n_gpus, args.timeout))
        r = rows[-1]
        print(f"[selfcheck_gpu] {r['case']}: {r['verdict']}" + (f" ({r['why']})" if r.get("why") else ""),
              flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".tmp", "w") as f:             # kernels import nothing of repro: a plain atomic write
        json.dump({"check": "TapChannel device transports", **environment(), "rows": rows}, f, indent=2, default=str)
    os.replace(args.out + ".tmp", args.out)
    print(f"\n{'case':38} {'verdict':8} detail")
    for r in rows:
        detail = r.get("why") or (f"{r['gets']} taps bit-exact, {r['elapsed_s']:.2f} s" if "gets" in r
                                  else f"mapped on {r.get('mapped_on')}, both bad offers refused")
        print(f"{r['case']:38} {r['verdict']:8} {detail[:200]}")
    print(f"report: {args.out}")
    if any(r["verdict"] == "FAIL" for r in rows):
        return 1
    return 0 if any(r["verdict"] == "pass" for r in rows) else 3


if __name__ == "__main__":
    sys.exit(main())
