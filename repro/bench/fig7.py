"""Figure 7: fan-in of PP-1 source stages into the draft's stage, TapChannel vs host staging.

One process per pipeline stage (``--pp``, default 4). Sources hold the taps the draft needs of a
Qwen3-8B-shaped policy (hidden 4096, 36 layers cut into PP stages; EAGLE-3 taps [emb, 1, 17, 32],
DFlash/DSpark taps [1, 9, 17, 25, 33]; a tap on the draft's own stage stays local and is not
sent), one microbatch of T tokens each. Measured per (layout, T, transport):

  fan-in      barrier, every source puts its taps, the draft gets all of them: seconds on the
              draft (median of repeats), bytes delivered / seconds = fan-in GB/s;
  slowdown    every rank runs a compute loop sized like its stage's forward of the microbatch
              (2 * params/PP * T FLOPs of matmuls); with transfers: sources put before computing,
              the draft gets after computing. Slowdown = time with / time without - 1, per rank,
              A/B interleaved.

Settings come from the profile's ``fig7:`` section (``repro.core.profile.Fig7``): GPU ``cuda_ipc`` (colocated
processes; on one GPU all ranks share it) vs ``host_staging``; CPU ``shm`` vs ``host_staging`` (cpu-emulated, sizes
scaled down). ``p2p`` (torch.distributed point-to-point) is measured wherever the machine allows it (gloo on a
CPU, NCCL when every stage has its own GPU); a transport the machine cannot run is skipped with its reason in
bench.json's ``summary.not_run``. The first measured transport other than host staging is the one the summary row
compares; a stage without taps computes but is left out of the all-ranks slowdown. Rows (metric names of
experiments/paper_numbers.csv): ``pp=4/<layout>/T=<T>/<transport>``, ``pp=4/<layout>/T=<T>`` and the summary row
``pp=4`` (medians over configs of write_bandwidth_gbps, speedup_vs_host_staging, the slowdowns; min/max beside).

    python -m repro.bench.fig7 --profile cpu-tiny                   # results/<hw>/cpu-tiny/fig7
    python -m repro.bench.fig7 --profile h200 --out $OUT/fig7       # on a GPU machine
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from kernels.transport import ChannelLayout, TapChannel, TapSpec
from kernels.transport.transports import TRANSPORTS
from repro.core.progress import Progress
from repro.parallel.partition import split_layers, stage_of_tap

QWEN3_8B = {"num_layers": 36, "hidden": 4096, "params": 8.2e9}
TAP_LAYOUTS = {"eagle3": (-1, 1, 17, 32), "dflash": (1, 9, 17, 25, 33)}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
BASELINE = "host_staging"

@dataclass(frozen=True)
class Fig7Config:
    pp: int = 4
    device: str = "cpu"
    transports: tuple[str, ...] = ("shm", "host_staging")
    layouts: tuple[str, ...] = ("eagle3", "dflash")
    tokens: tuple[int, ...] = (256, 1024)
    hidden: int = 1024
    dtype: str = "bfloat16"
    compute_scale: float = 1.0  # fraction of a Qwen3-8B stage's forward FLOPs in the compute loop
    repeats: int = 5
    warmup: int = 1
    ring_depth: int = 2
    check: bool = True

    def __post_init__(self) -> None:
        bad = [name for name in self.layouts if name not in TAP_LAYOUTS]
        if bad:
            raise ValueError(f"layouts {bad}: expected names from {sorted(TAP_LAYOUTS)}")
        if self.pp < 2:
            raise ValueError(f"pp={self.pp}: the fan-in needs at least one source stage (pp >= 2)")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: expected one of {sorted(DTYPES)}")
        if any(t < 1 for t in self.tokens) or self.repeats < 1:
            raise ValueError(f"tokens {self.tokens} and repeats {self.repeats} must be positive")
        bad = [t for t in self.transports if t not in TRANSPORTS]
        if bad or not self.transports:
            raise ValueError(f"transports {list(self.transports)}: expected a non-empty list of "
                             f"{list(TRANSPORTS)}")


def unavailable(transport: str, cfg: Fig7Config, n_gpus: int) -> str | None:
    """Why this machine cannot run ``transport`` under ``cfg`` (None when it can)."""
    cuda = cfg.device == "cuda"
    if transport == "cuda_ipc" and not cuda:
        return "cuda_ipc carries CUDA tensors; the profile's fig7 device is cpu"
    if transport in ("shm", "gloo") and cuda:
        return f"{transport} carries CPU tensors; the profile's fig7 device is cuda"
    if transport == "p2p" and cuda and n_gpus < cfg.pp:
        return (f"p2p on GPUs runs over NCCL, which needs one GPU per stage: pp={cfg.pp}, {n_gpus} GPU(s) "
                "here")
    return None


def channel_backend(transport: str, device: torch.device) -> str:
    """The channel group's backend: NCCL for device tensors over p2p, gloo for every other transport (their
    group only exchanges names and barriers)."""
    return "nccl" if transport == "p2p" and device.type == "cuda" else "gloo"


def fanin_layout(cfg: Fig7Config, layout: str, tokens: int) -> ChannelLayout:
    """Rings of the sources (stages != last) that produce a tap of ``layout`` for a T-token microbatch."""
    ranges = split_layers(QWEN3_8B["num_layers"], cfg.pp)
    last = cfg.pp - 1
    sources: dict[int, list[TapSpec]] = {}
    for tap in TAP_LAYOUTS[layout]:
        stage = stage_of_tap(tap, ranges)
        if stage != last:
            name = "embed" if tap == -1 else f"L{tap}"
            sources.setdefault(stage, []).append(TapSpec(name, (tokens, cfg.hidden), DTYPES[cfg.dtype]))
    return ChannelLayout(sources=sources, stage_to_rank={s: s for s in range(cfg.pp)}, consumer_rank=last,
                         ring_depth=cfg.ring_depth)


def tap_tensor(stage: int, name: str, shape, dtype, device) -> torch.Tensor:
    """Deterministic random payload of a tap (random, never zeros); both sides can rebuild it."""
    g = torch.Generator(device=device).manual_seed(zlib.crc32(f"{stage}/{name}".encode()))
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


class ComputeLoop:
    """Matmuls standing in for a stage's forward of the microbatch: ``flops`` in n x n x n products."""

    def __init__(self, flops: float, device: torch.device):
        self.device = device
        self.n = 4096 if device.type == "cuda" else 256
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        g = torch.Generator(device=device).manual_seed(7)
        self.a = torch.randn(self.n, self.n, device=device, dtype=dtype, generator=g)
        self.b = torch.randn(self.n, self.n, device=device, dtype=dtype, generator=g)
        self.c = torch.empty_like(self.a)
        self.k = max(1, round(flops / (2 * self.n ** 3)))

    def run(self) -> None:
        for _ in range(self.k):
            torch.mm(self.a, self.b, out=self.c)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_worker(rank: int, world: int, cfg: Fig7Config, transports: tuple[str, ...]) -> dict:
    """One rank of the benchmark (call under kernels.launch.spawn, world == cfg.pp) over ``transports``."""
    device = torch.device(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(0 if torch.cuda.device_count() == 1 else rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    out = []
    bar = Progress(len(cfg.layouts) * len(cfg.tokens) * len(transports), "[fig7] configurations", every_s=0,
                   unit="config") if rank == 0 else None
    for layout_name in cfg.layouts:
        for tokens in cfg.tokens:
            flops = 2 * QWEN3_8B["params"] / cfg.pp * tokens * cfg.compute_scale
            compute = ComputeLoop(flops, device)
            for transport in transports:
                out.append(_measure_one(rank, cfg, layout_name, tokens, transport, compute, device))
                if bar is not None:
                    bar.update(info=f"{layout_name} T={tokens} {transport}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return {"rank": rank, "rows": out}


def _measure_one(rank, cfg, layout_name, tokens, transport, compute, device) -> dict:
    layout = fanin_layout(cfg, layout_name, tokens)
    draft = layout.consumer_rank
    ch = TapChannel.setup(layout, transport, backend=channel_backend(transport, device), device=device,
                          get_timeout_s=300, put_timeout_s=300)
    mine = {s: [(spec, tap_tensor(s, spec.name, spec.max_shape, spec.dtype, device)) for spec in specs]
            for s, specs in layout.sources.items() if layout.stage_to_rank[s] == rank}
    total_bytes = sum(spec.max_nbytes for specs in layout.sources.values() for spec in specs)
    seq = 0
    mismatches = 0

    def put_all(s):
        for stage, taps in mine.items():
            for spec, t in taps:
                ch.put(stage, spec.name, s, t)

    def get_all(s, check=False):
        nonlocal mismatches
        for stage in layout.sources:
            got = ch.get_stage(stage, s)
            if check:
                for name, t in got.items():
                    spec = layout.ring(stage, name).tap
                    want = tap_tensor(stage, name, spec.max_shape, spec.dtype, device)
                    mismatches += not torch.equal(t, want)
        _sync(device)

    def release_all(s):
        for stage in layout.sources:
            ch.release(stage, s)

    def fanin_iter(check=False) -> float:
        nonlocal seq
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        if rank != draft:
            put_all(seq)
        elapsed = 0.0
        if rank == draft:
            get_all(seq, check)
            elapsed = time.perf_counter() - t0
            release_all(seq)
        seq += 1
        return elapsed

    def work_iter(transfer: bool) -> float:
        nonlocal seq
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        if transfer and rank != draft:
            put_all(seq)
        compute.run()
        if transfer and rank == draft:
            get_all(seq)
        _sync(device)
        elapsed = time.perf_counter() - t0
        if transfer:
            if rank == draft:
                release_all(seq)
            seq += 1
        return elapsed

    for _ in range(cfg.warmup):
        fanin_iter()
    if cfg.check:
        fanin_iter(check=True)
    fanin = [fanin_iter() for _ in range(cfg.repeats)]
    for _ in range(cfg.warmup):
        work_iter(False), work_iter(True)
    base, with_tx = [], []
    for _ in range(cfg.repeats):
        base.append(work_iter(False))
        with_tx.append(work_iter(True))
    if cfg.check:
        fanin_iter(check=True)
    ch.flush()
    ch.close()
    return {"layout": layout_name, "tokens": tokens, "transport": transport, "rank": rank,
            "role": "draft" if rank == draft else ("source" if mine else "idle"), "bytes": total_bytes,
            "n_taps": sum(len(v) for v in layout.sources.values()), "fanin_s": fanin if rank == draft else [],
            "compute_s": base, "compute_with_transfer_s": with_tx, "compute_iters": compute.k,
            "mismatches": mismatches}


def slowdown_pct(row: dict) -> float:
    with_tx, base = statistics.median(row["compute_with_transfer_s"]), statistics.median(row["compute_s"])
    return 100.0 * (with_tx / base - 1.0)


def summarize_rows(per_rank: list[dict], cfg: Fig7Config) -> list[dict]:
    """Join the ranks' rows into one record per (layout, tokens, transport)."""
    by_key: dict[tuple, list[dict]] = {}
    for r in per_rank:
        for row in r["rows"]:
            by_key.setdefault((row["layout"], row["tokens"], row["transport"]), []).append(row)
    out = []
    for (layout, tokens, transport), rows in by_key.items():
        draft = next(r for r in rows if r["role"] == "draft")
        sources = [r for r in rows if r["role"] == "source"]
        fan = statistics.median(draft["fanin_s"])
        out.append({"layout": layout, "tokens": tokens, "transport": transport, "bytes": draft["bytes"],
                    "n_taps": draft["n_taps"], "fanin_samples_s": draft["fanin_s"], "fanin_s": fan,
                    "bandwidth_gbps": draft["bytes"] / fan / 1e9,
                    "source_slowdown_pct": statistics.mean(slowdown_pct(r) for r in sources),
                    "draft_slowdown_pct": slowdown_pct(draft),
                    "all_ranks_slowdown_pct": statistics.mean(slowdown_pct(r) for r in [*sources, draft]),
                    "per_rank": rows, "mismatches": sum(r["mismatches"] for r in rows)})
    return out


def run(cfg: Fig7Config, out: Path, profile: str, timeout_s: float = 1800) -> list[dict]:
    from kernels.launch import spawn
    from repro.core.timing import BenchRun

    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    not_run = {t: why for t in cfg.transports if (why := unavailable(t, cfg, n_gpus))}
    for t, why in not_run.items():
        print(f"[fig7] not measuring {t}: {why}", flush=True)
    transports = tuple(t for t in cfg.transports if t not in not_run)
    if not transports:
        raise ValueError(f"none of the transports {list(cfg.transports)} can run here: {not_run}")
    per_rank = spawn(measure_worker, cfg.pp, args=(cfg, transports), timeout_s=timeout_s, backend="gloo")
    records = summarize_rows(per_rank, cfg)
    bad = [(r["layout"], r["tokens"], r["transport"]) for r in records if r["mismatches"]]
    if bad:
        raise RuntimeError(f"taps arrived corrupted for {bad}; no numbers written")
    base = BASELINE
    tap = next((t for t in transports if t != base), None)
    fanin = {(r["layout"], r["tokens"], r["transport"]): r["fanin_s"] for r in records}
    summary: dict[str, list[float]] = {"write_bandwidth_gbps": [], "speedup_vs_host_staging": [],
                                       "source_slowdown_pct": [], "draft_slowdown_pct": [],
                                       "host_staging_slowdown_pct": []}
    with BenchRun(out, artifact="fig7", profile=profile, config=asdict(cfg)) as bench:
        bench.summary["not_run"] = not_run
        for r in records:
            base_s = fanin.get((r["layout"], r["tokens"], base))
            vs_base = {"speedup_vs_host_staging": base_s / r["fanin_s"]} \
                if base_s is not None and r["transport"] != base else {}
            bench.record(f"pp={cfg.pp}/{r['layout']}/T={r['tokens']}/{r['transport']}",
                         {k: r[k] for k in ("layout", "tokens", "transport", "bytes", "n_taps")},
                         r["fanin_samples_s"],
                         extra={"fanin_s": r["fanin_s"], "bandwidth_gbps": r["bandwidth_gbps"],
                                "message_mb": r["bytes"] / 1e6,
                                "source_slowdown_pct": r["source_slowdown_pct"],
                                "draft_slowdown_pct": r["draft_slowdown_pct"],
                                "all_ranks_slowdown_pct": r["all_ranks_slowdown_pct"], **vs_base})
            bench.records[-1]["per_rank"] = r["per_rank"]
        for layout in cfg.layouts:
            for tokens in cfg.tokens:
                pick = {r["transport"]: r for r in records if r["layout"] == layout and r["tokens"] == tokens}
                if tap not in pick or base not in pick:
                    continue
                a, b = pick[tap], pick[base]
                row = {"message_mb": a["bytes"] / 1e6,
                       "write_bandwidth_gbps": a["bandwidth_gbps"],
                       "speedup_vs_host_staging": b["fanin_s"] / a["fanin_s"],
                       "source_slowdown_pct": a["source_slowdown_pct"],
                       "draft_slowdown_pct": a["draft_slowdown_pct"],
                       "host_staging_slowdown_pct": b["all_ranks_slowdown_pct"]}
                for k, v in row.items():
                    if k in summary:
                        summary[k].append(v)
                pair = {"layout": layout, "tokens": tokens, "transport": tap, "baseline": base}
                bench.record(f"pp={cfg.pp}/{layout}/T={tokens}", pair, extra=row)
        if summary["speedup_vs_host_staging"]:
            extra = {}
            for k, vals in summary.items():
                extra[k] = statistics.median(vals)
                extra[f"{k}_min"], extra[f"{k}_max"] = min(vals), max(vals)
            bench.record(f"pp={cfg.pp}", {"transport": tap, "baseline": base, "configs": len(vals),
                                          "statistic": "median over layouts and message sizes"}, extra=extra)
    return records


def config_for(profile: str, overrides: dict | None = None) -> Fig7Config:
    """The ``fig7:`` section of the profile (``load_profile_model(profile).fig7``), with command-line
    overrides."""
    from repro.core.profile import load_profile_model
    section = load_profile_model(profile).fig7
    if section is None:
        raise ValueError(f"profile {profile!r} has no fig7: section (experiments/profiles/{profile}.yaml); "
                         "profiles with one: cpu-tiny, h200")
    values = section.model_dump()
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    for k in ("transports", "tokens", "layouts"):
        values[k] = tuple(values[k])
    return Fig7Config(**values)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="cpu-tiny", help="cpu-tiny (CPU, shm vs host staging) or h200 (GPU)")
    ap.add_argument("--out", type=Path, default=None, help="run folder (default results/<hw>/<profile>/fig7)")
    ap.add_argument("--pp", type=int, default=None, help="pipeline stages = processes (default 4)")
    ap.add_argument("--tokens", type=int, nargs="+", default=None, help="microbatch lengths T")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=1800, help="hard timeout of the whole run, seconds")
    args = ap.parse_args(argv)
    cfg = config_for(args.profile, {"pp": args.pp, "tokens": args.tokens, "repeats": args.repeats})
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"profile {args.profile!r} needs a CUDA device; this machine has none")
    if args.out is None:
        from repro.core.provenance import hardware
        args.out = Path("results") / hardware()["tag"] / args.profile / "fig7"
    records = run(cfg, args.out, args.profile, args.timeout)
    print(f"{'layout':8} {'T':>6} {'transport':13} {'MB':>8} {'fan-in ms':>10} {'GB/s':>8} {'src %':>7} "
          f"{'draft %':>8}")
    for r in records:
        print(f"{r['layout']:8} {r['tokens']:>6} {r['transport']:13} {r['bytes'] / 1e6:>8.1f} "
              f"{r['fanin_s'] * 1e3:>10.3f} {r['bandwidth_gbps']:>8.2f} {r['source_slowdown_pct']:>7.1f} "
              f"{r['draft_slowdown_pct']:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
