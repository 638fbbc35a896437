"""Is a launch-bound process's speed a property of the CPUs it runs on?

On the H200 the RL update is host-bound (its CPU seconds equal its wall seconds) and the same no-draft update
measures 0.27-0.33 s from one process to the next (table1's no-draft run vs the no-draft arm of the A/B probe inside
each drafted run), which is as large as the update overheads the tables report. This tool starts fresh child
processes, each pinned to one CPU set and interleaved over rounds: unpinned (every CPU this process may use), each
NUMA node's CPUs (the GPU's own node named), or, on a one-node host, each half of the CPUs. Every child builds the
no-draft row's trainer, runs two warm-up steps, then times ``--repeats`` updates of one fixed rollout batch and
``--rollouts`` rollouts. Writes ``<out>/host_binding.json``: the topology, every child's samples, and per CPU set the
median of the children's medians.

    python -m repro.bench.host_binding --profile h200 --rounds 2 --out $OUT/host_binding       # one GPU, ~3 min
    python -m repro.bench.host_binding --profile cpu-tiny --rounds 1 --repeats 2 --rollouts 1 --out /tmp/hb
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULT_TAG = "HOST_BINDING_RESULT "


def parse_cpulist(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11} (the kernel's cpulist format)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            cpus.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise ValueError(f"not a cpulist: {text!r} (expected e.g. '0-3,8')") from None
    return cpus


def format_cpulist(cpus: set[int]) -> str:
    out, run = [], []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def numa_nodes(sys_root: Path = Path("/sys"), allowed: set[int] | None = None) -> dict[int, set[int]]:
    """NUMA node -> the CPUs of that node this process may run on (nodes without such CPUs left out)."""
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
    nodes = {}
    for d in sorted((sys_root / "devices/system/node").glob("node[0-9]*")):
        cpus = parse_cpulist((d / "cpulist").read_text()) & allowed
        if cpus:
            nodes[int(d.name[4:])] = cpus
    return nodes


def gpu_numa_node(sys_root: Path = Path("/sys")) -> int | None:
    """The NUMA node of CUDA device 0's PCI slot, or None (no GPU, or the kernel does not say: -1)."""
    import torch
    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(0)
    try:
        bus = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        node = int((sys_root / "bus/pci/devices" / bus / "numa_node").read_text())
    except (AttributeError, OSError, ValueError):
        return None
    return node if node >= 0 else None


def cpu_sets(nodes: dict[int, set[int]], allowed: set[int], gpu_node: int | None) -> dict[str, set[int]]:
    """The CPU sets to compare: unpinned, then each NUMA node (or, with one node, each half of the CPUs)."""
    sets = {"unpinned": set(allowed)}
    if len(nodes) > 1:
        for n, cpus in nodes.items():
            sets[f"node{n}" + (" (GPU's)" if n == gpu_node else "")] = cpus
    elif len(allowed) >= 2:
        ordered = sorted(allowed)
        half = len(ordered) // 2
        sets["first half"], sets["second half"] = set(ordered[:half]), set(ordered[half:])
    return sets


def child(profile: str, row: str, repeats: int, rollouts: int, out: Path) -> dict:
    """One pinned process: time ``repeats`` updates of a fixed batch and ``rollouts`` rollouts."""
    os.environ.setdefault("WANDB_MODE", "disabled")
    import torch

    from repro.report.profiles import load_profile
    from repro.rl.config import run_config_from_profile
    from repro.rl.grpo import group_advantages
    from repro.rl.summary import run_dir_name
    from repro.rl.tokenizer import build_workload_tokenizer
    from repro.rl.trainer import CoTrainer

    prof = load_profile(profile)
    tok = build_workload_tokenizer(out / "tokenizer", int(prof["rl"].get("vocab_size", 512)), 0)
    base = CoTrainer(run_config_from_profile(prof, "table1", row, out=str(out / "runs" / run_dir_name(row))), tok)
    for s in range(2):
        base.train_step(s)
    batch = base.rollout(2)
    g = base.cfg.grpo
    adv = group_advantages(batch.rewards, g.generations_per_prompt, g.normalize_std)
    base.update.step(batch, adv, anchor_seed=0, temperature=g.temperature)
    updates = [base.update.step(batch, adv, anchor_seed=k, temperature=g.temperature).update_time_s
               for k in range(repeats)]
    rollout_s = []
    for k in range(rollouts):
        t = time.perf_counter()
        base.rollout(3 + k)
        rollout_s.append(time.perf_counter() - t)
    stat = Path("/proc/self/stat")
    last_cpu = int(stat.read_text().rsplit(")", 1)[1].split()[36]) if stat.exists() else -1
    return {"update_s": updates, "rollout_s": rollout_s, "torch_threads": torch.get_num_threads(),
            "affinity": format_cpulist(set(os.sched_getaffinity(0))), "last_cpu": last_cpu}


def run_child(args, cpus: set[int], out: Path) -> dict:
    cmd = [sys.executable, "-m", "repro.bench.host_binding", "--child", "--profile", args.profile, "--row", args.row,
           "--repeats", str(args.repeats), "--rollouts", str(args.rollouts), "--out", str(out)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=args.child_timeout_s,
                          preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise RuntimeError(f"child on CPUs {format_cpulist(cpus)} exited {proc.returncode} without a result:\n"
                       + proc.stderr[-3000:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--row", default="Qwen3-8B/no draft", help="table1 row whose update and rollout are timed")
    ap.add_argument("--rounds", type=int, default=2, help="children per CPU set, the sets interleaved (default 2)")
    ap.add_argument("--repeats", type=int, default=8, help="timed updates per child (default 8)")
    ap.add_argument("--rollouts", type=int, default=3, help="timed rollouts per child (default 3)")
    ap.add_argument("--child-timeout-s", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=Path("host_binding_out"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1 or args.rollouts < 0:
        ap.error(f"--rounds and --repeats must be >= 1 and --rollouts >= 0, got {args.rounds}, {args.repeats} "
                 f"and {args.rollouts}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        print(RESULT_TAG + json.dumps(child(args.profile, args.row, args.repeats, args.rollouts, args.out)),
              flush=True)
        return 0

    from repro.bench.common import summarize
    from repro.report.provenance import provenance, write_json_atomic

    allowed = set(os.sched_getaffinity(0))
    nodes, gpu_node = numa_nodes(allowed=allowed), gpu_numa_node()
    sets = cpu_sets(nodes, allowed, gpu_node)
    names = list(sets)
    children: list[dict] = []
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:      # rotate the order each round
            res = run_child(args, sets[name], args.out)
            res |= {"cpu_set": name, "round": r, "update_median_s": summarize(res["update_s"])["median"]}
            children.append(res)
            print(f"[round {r}] {name} (CPUs {format_cpulist(sets[name])}): update median "
                  f"{res['update_median_s'] * 1e3:.1f} ms, rollouts "
                  + ", ".join(f"{x:.2f}" for x in res["rollout_s"]) + " s", flush=True)
    per_set = {}
    for name in names:
        mine = [c for c in children if c["cpu_set"] == name]
        per_set[name] = {"cpus": format_cpulist(sets[name]),
                         "update_s": summarize([c["update_median_s"] for c in mine]),
                         "rollout_s": summarize([x for c in mine for x in c["rollout_s"]]) if args.rollouts else None}
    medians = [v["update_s"]["median"] for v in per_set.values()]
    all_children = [c["update_median_s"] for c in children]
    report = {"config": vars(args) | {"out": str(args.out)},
              "topology": {"allowed_cpus": format_cpulist(allowed), "cpu_count": os.cpu_count(),
                           "numa_nodes": {n: format_cpulist(c) for n, c in nodes.items()}, "gpu_numa_node": gpu_node},
              "per_cpu_set": per_set, "children": children,
              "slowest_over_fastest_set": max(medians) / min(medians),
              "slowest_over_fastest_child": max(all_children) / min(all_children)}
    write_json_atomic(args.out / "host_binding.json", {**report, "provenance": provenance(report["config"])})
    print(f"update, slowest over fastest CPU set {report['slowest_over_fastest_set']:.3f}x, over fastest child "
          f"{report['slowest_over_fastest_child']:.3f}x: {args.out / 'host_binding.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
