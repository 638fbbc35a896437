"""The one-GPU co-training session: an RL artifact's rows (Table 1 by default) end to end on one device call.

Meant for a single call on a machine with one H200 (the suite's ``run`` device), where the workflow
cannot run (no snakemake or wandb there). It does what the workflow's RL rules do, each job in its
own process as the workflow runs them (rows run one after another in one process would inherit the earlier
rows' memory, allocator state and garbage-collector load: their update times grew row after row):

    1. ``python -m repro.rl.sft`` for each policy the rows need (tokenizer, policy, drafts);
    2. ``python -m repro.rl.run --artifact <artifact>`` for each row (config from the profile, ``CoTrainer``,
       ``MetricsLogger`` with W&B disabled) in profile order, no-draft rows first, or, when the artifact section
       says ``lockstep: true`` (or with ``--lockstep``), one ``python -m repro.rl.lockstep`` per policy training
       its rows together from the start, steps interleaved (the host's speed drifts between processes); then
       the baseline's replicas of a figure (``baseline_seeds``: sampling seeds, folders ``<row>_sampling<k>`` as
       the workflow names them), while the time budget lasts (rows left out are listed as skipped, never invented);
    3. ``repro.rl.summary`` over the finished rows.

Everything lands in ``<out>/<artifact>/<row>/`` (env.json, metrics.jsonl, run.json) and ``<out>/sft/*/sft.json``,
packed into ``<out>/h200_rl.tar.gz`` plus ``<out>/gpu_rl.json`` (summary, timings, skipped rows);
unpack the tarball into ``results/<hw>/h200/`` afterwards so ``collect`` sees the runs.

    PYTHONUNBUFFERED=1 WANDB_MODE=disabled python -m repro.bench.gpu_rl --out $OUT --budget-s 330
    ... --policies dense --steps 16          # the dense rows only, 16 steps each
    ... --rows "Qwen3-8B/DFlash,Qwen3-8B/DSpark" --budget-s 420   # two rows and their no-draft baseline
    ... --artifact fig3 --budget-s 480       # Figure 3's rows and the baseline's seed replicas
    ... --lockstep                           # each policy's rows in one process, steps interleaved (repro.rl.lockstep)
    ... --sft-cache .cache/sft               # reuse the SFT warm start of an earlier call on the same warm machine
    ... --sft-only --sft-cache .cache/sft    # only build that warm start, for the calls that follow
    ... --rows DFlash,DSpark --without-baseline --steps 60   # drafted rows alone (their curves; no speedups)
    ... --budget-s 400 --deadline-s 520      # start no row after 400 s, and none expected to end past 520 s

The SFT (~170 s of a 600 s call on the H200) is the same for every math artifact of a profile: with
``--sft-cache`` in an ignored folder of the repository, a call made while the device is still warm (its idle
window is short: make the next call right after) reuses it (``sft_cache_key``: same policy, vocabulary, SFT
settings, workload and SFT-relevant source; every draft the rows need).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

import yaml

from repro.report.metrics import MetricsLogger
from repro.report.provenance import provenance, write_json_atomic
from repro.report.seed_spread import replica_run_name
from repro.rl.config import ARTIFACTS, artifact_rows, load_run_profile, sft_spec
from repro.rl.summary import run_dir_name, summarize


def _job(cmd: list[str], log: Path) -> None:
    """Run one workflow job in its own process, its output teed to ``log``; raise on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print("$ " + " ".join(cmd), flush=True)
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            fh.write(line)
            print(line, end="", flush=True)
        rc = proc.wait()
    if rc:
        raise RuntimeError(f"{cmd[2]} exited with {rc} (log: {log})")


SFT_CODE = ("repro/rl", "repro/models", "repro/rollout", "repro/parallel", "kernels")   # what an SFT run executes


def sft_cache_key(prof: dict, pol: str, workload: str) -> str:
    """What an SFT warm start depends on: the policy spec, vocabulary, SFT settings, workload, dtype and device of
    the profile, and the source of the packages SFT runs (any change to them gives a new key)."""
    rl = prof["rl"]
    h = hashlib.sha256(json.dumps({"policy": rl["policies"][pol], "vocab": rl.get("vocab_size"),
                                   "sft": vars(sft_spec(rl, workload)), "workload": workload,
                                   "dtype": prof.get("dtype"), "device": prof.get("hardware", {}).get("device")},
                                  sort_keys=True, default=str).encode())
    root = Path(__file__).resolve().parents[2]
    for sub in SFT_CODE:
        for f in sorted((root / sub).rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _warm_start(py, prof, prof_file, pol, workload, names, out: Path, cache: str) -> tuple[Path, bool]:
    """The SFT warm start of ``pol`` with the ``names`` drafts: from ``cache`` when one there has the same key
    (``sft_cache_key``) and every draft, else a new SFT run (into the cache when given, with the drafts it held
    before as well). With a cache, its sft.json and log are copied under ``<out>/sft/`` for the record."""
    log = out / "sft" / f"{pol}-{workload}.log"
    if not cache:
        ws = out / "sft" / f"{pol}-{workload}"
        _job(py + ["repro.rl.sft", "--profile", str(prof_file), "--policy", pol, "--workload", workload,
                   "--drafts", ",".join(names), "--out", str(ws)], log)
        return ws, False
    ws = Path(cache) / f"{pol}-{workload}-{sft_cache_key(prof, pol, workload)}"
    cached_log = ws.parent / f"{ws.name}.log"
    have = set(json.loads((ws / "sft.json").read_text()).get("drafts") or {}) if (ws / "sft.json").exists() else set()
    reused = (ws / "sft.json").exists() and set(names) <= have
    if reused:
        print(f"SFT warm start reused from {ws} (drafts {sorted(have)})", flush=True)
        if cached_log.exists():
            log.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(cached_log, log)
    else:                           # the cached drafts too, so that the new warm start serves every earlier call's rows
        shutil.rmtree(ws, ignore_errors=True)
        _job(py + ["repro.rl.sft", "--profile", str(prof_file), "--policy", pol, "--workload", workload,
                   "--drafts", ",".join(sorted(set(names) | have)), "--out", str(ws)], log)
        shutil.copy2(log, cached_log)
    rec = out / "sft" / f"{pol}-{workload}"
    rec.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ws / "sft.json", rec / "sft.json")
    return ws, reused


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu_rl_out"))
    ap.add_argument("--profile", default="h200", help="profile name, or a path to a profile .yaml file "
                    "(e.g. one written by repro.rl.derive_profile)")
    ap.add_argument("--artifact", default="table1", choices=ARTIFACTS, help="the RL artifact whose rows run")
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop starting new rows after this many seconds")
    ap.add_argument("--deadline-s", type=float, default=0.0,
                    help="the call's hard end in seconds (e.g. the timeout it runs under; 0: none): a row whose "
                         "expected time, the same row's earlier run in this call (a seed replica: its baseline's or "
                         "an earlier replica's), would end past it is skipped instead of being cut")
    ap.add_argument("--steps", type=int, default=0, help="override the artifact's steps (0: keep)")
    ap.add_argument("--sft-steps", type=int, default=0, help="override rl.sft.steps and draft_steps (0: keep; "
                    "for a quick CPU check of this script)")
    ap.add_argument("--policies", default="", help="comma-separated keys of rl.policies whose rows run (default all)")
    ap.add_argument("--rows", default="", help="comma-separated rows of the artifact to run (default all of --policies); "
                    "a drafted row brings its baseline row along")
    ap.add_argument("--sft-cache", default="",
                    help="folder kept between device calls (an ignored path of the repository, e.g. .cache/sft, "
                         "survives while the machine stays warm): an SFT warm start is reused from it when the "
                         "policy, workload, vocabulary, SFT settings and SFT-relevant code are the same and it has "
                         "every draft the rows need (see sft_cache_key)")
    ap.add_argument("--lockstep", action="store_true",
                    help="run each policy's rows in one process with their steps interleaved (repro.rl.lockstep): "
                         "the host's speed drift and process state hit every row alike; seed replicas stay separate "
                         "(default: the artifact section's lockstep setting)")
    ap.add_argument("--seeds", default="",
                    help="comma-separated baseline seeds whose replicas run (default: all of the artifact's "
                         "baseline_seeds), e.g. the ones an earlier call did not reach; 'none': no replicas")
    ap.add_argument("--seed-replicas-only", action="store_true",
                    help="run only the baselines' seed replicas (baseline_seeds) of the chosen rows, e.g. to add a seed "
                         "band to a figure whose main rows ran in an earlier call")
    ap.add_argument("--without-baseline", action="store_true",
                    help="run the chosen drafted rows without their no-draft baseline row: their own curves "
                         "(reward, acceptance length) over a long run, split across calls or GPUs; the summary then "
                         "has no speedups or update overhead; the baseline's seed replicas run only when --seeds "
                         "names them")
    ap.add_argument("--sft-only", action="store_true",
                    help="only build the SFT warm start the chosen rows need (into --sft-cache, which it requires) "
                         "and stop: a first call on a warm machine whose next calls reuse it")
    args = ap.parse_args(argv)
    if args.sft_only and not args.sft_cache:
        raise SystemExit("--sft-only needs --sft-cache: the warm start is kept for later calls there")
    if args.without_baseline and args.seed_replicas_only:
        raise SystemExit("--without-baseline and --seed-replicas-only exclude each other: the replicas are baselines")
    os.environ.setdefault("WANDB_MODE", "disabled")
    t0 = time.perf_counter()
    out = Path(args.out)
    prof = load_run_profile(args.profile)
    art = args.artifact
    if args.steps:
        prof[art]["steps"] = args.steps
    rl, rows = prof["rl"], artifact_rows(prof, art)
    workload = ((prof[art].get("workload") or {}).get("name") or (rl.get("workload") or {}).get("name", "math"))
    if args.sft_steps:
        short = {"steps": args.sft_steps, "draft_steps": args.sft_steps}
        rl["sft"] = {**rl["sft"], **short}
        if rl["sft"].get("workloads"):                       # the per-workload overrides are shortened too
            rl["sft"]["workloads"] = {w: {**o, **short} for w, o in rl["sft"]["workloads"].items()}
    # no-draft rows first within each policy, policies in order of appearance
    policies = list(dict.fromkeys((spec or {}).get("policy", "dense") for spec in rows.values()))
    if args.policies:
        wanted = [p for p in args.policies.split(",") if p]
        bad = [p for p in wanted if p not in policies]
        if bad:
            raise SystemExit(f"--policies {bad} are not policies of {art}'s rows; expected some of {policies}")
        policies = [p for p in policies if p in wanted]
    order = [r for p in policies for r in sorted((r for r, s in rows.items() if s.get("policy", "dense") == p),
                                                  key=lambda r: bool(rows[r].get("draft")))]
    if args.rows:
        wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
        bad = [r for r in wanted if r not in order]
        if bad:
            raise SystemExit(f"--rows {bad} are not {art} rows of the chosen policies; expected some of {order}")
        keep = set(wanted) | {rows[r]["baseline"] for r in wanted if rows[r].get("baseline")}
        order = [r for r in order if r in keep]
    dropped: list[str] = []          # the baselines --without-baseline leaves out (their replicas run with --seeds)
    if args.without_baseline:
        order = [r for r in order if rows[r].get("draft")]
        dropped = sorted({rows[r]["baseline"] for r in order if rows[r].get("baseline")})
        if not order:
            raise SystemExit(f"--without-baseline: no drafted rows of {art} chosen; expected --rows naming some")
        rows = {r: ({**s, "baseline": None} if r in order else s) for r, s in rows.items()}
    out.mkdir(parents=True, exist_ok=True)
    prof_file = out / f"profile_{prof['name']}.yaml"        # the profile with this call's overrides, for the jobs
    prof_file.write_text(yaml.safe_dump(prof, sort_keys=False))
    # a figure's baseline replicas: sampling seeds k of the main runs' seed 0 (the workflow's default seed)
    seeds = [int(k) for k in dict.fromkeys(prof[art].get("baseline_seeds") or []) if int(k) != 0]
    if args.seeds.strip().lower() == "none":
        seeds = []
    elif args.seeds:
        try:
            wanted = [int(k) for k in args.seeds.split(",") if k.strip()]
        except ValueError:
            raise SystemExit(f"--seeds {args.seeds!r}: expected comma-separated integers, e.g. 3,4") from None
        bad = [k for k in wanted if k not in seeds]
        if bad:
            raise SystemExit(f"--seeds {bad} are not baseline_seeds of {art} in profile {args.profile!r}; "
                             f"expected some of {seeds}")
        seeds = wanted
    bases = sorted({rows[r]["baseline"] for r in order if rows[r].get("baseline")})
    if args.seed_replicas_only:
        bases = sorted({rows[r]["baseline"] if rows[r].get("baseline") else r for r in order})
    if args.without_baseline:
        bases = dropped if args.seeds else []
    jobs = [] if args.seed_replicas_only else [(r, 0, run_dir_name(r)) for r in order]
    jobs += [(b, k, replica_run_name(run_dir_name(b), k)) for k in seeds for b in bases]
    if not jobs:
        raise SystemExit(f"nothing to run: no seed replicas of {art} chosen (baseline_seeds in profile "
                         f"{args.profile!r}: {prof[art].get('baseline_seeds')}, --seeds {args.seeds or 'all'})"
                         if args.seed_replicas_only else f"nothing to run: no rows of {art} chosen")
    lockstep = bool(args.lockstep or prof[art].get("lockstep"))
    report: dict = {"profile": args.profile, "artifact": art, "workload": workload, "rows": {},
                    "lockstep": lockstep,
                    "skipped": [r for r in rows if r not in order],
                    "sft": {}, "errors": {}, "overrides": {"steps": args.steps, "sft_steps": args.sft_steps},
                    "without_baseline": args.without_baseline, "sft_only": args.sft_only}
    warm: dict[str, Path] = {}
    done: dict[str, dict] = {}
    py = [sys.executable, "-m"]
    if lockstep:                     # one job per policy: its rows together (no-draft first), then the replicas
        groups = [[j for j in jobs if not j[1] and rows[j[0]].get("policy", "dense") == p] for p in policies]
        jobs = [g for g in groups if g] + [[j] for j in jobs if j[1]]
    else:
        jobs = [[j] for j in jobs]

    def warm_up(pol: str) -> Path:
        """``pol``'s SFT warm start with the drafts of this call's rows (``_warm_start``), recorded in the report."""
        names = sorted({rows[r]["draft"] for r in order                 # the drafts this call runs
                        if rows[r].get("policy", "dense") == pol and rows[r].get("draft")})
        ts = time.perf_counter()
        ws, reused = _warm_start(py, prof, prof_file, pol, workload, names, out, args.sft_cache)
        summ = json.loads((ws / "sft.json").read_text())
        report["sft"][pol] = {k: summ.get(k) for k in ("sft_loss_first", "sft_loss_last", "heldout_accuracy",
                                                       "drafts", "sft_time_s", "total_time_s")}
        report["sft"][pol].update(wall_s=time.perf_counter() - ts, reused_from_cache=reused, folder=str(ws))
        return ws

    if args.sft_only:                # the warm start of each policy of the chosen rows, no rows
        jobs = []
        for pol in dict.fromkeys(rows[r].get("policy", "dense") for r in order):
            warm[pol] = warm_up(pol)
        report["skipped"] = list(rows)
    took: dict[str, float] = {}      # row label -> seconds its last job (or lockstep group) took in this call
    for group in jobs:
        row, seed, run_name = group[0]
        spec = rows[row]
        pol = spec.get("policy", "dense")
        labels = [r if not k else n for r, k, n in group]     # a main run by its row, a replica by its folder
        elapsed = time.perf_counter() - t0
        if elapsed > args.budget_s:
            report["skipped"] += labels
            continue
        expected = max((took.get(r, 0.0) for r, _, _ in group), default=0.0)
        if args.deadline_s and expected and elapsed + expected > args.deadline_s:
            print(f"skipping {labels}: expected {expected:.0f} s from {elapsed:.0f} s ends past the deadline "
                  f"{args.deadline_s:.0f} s", flush=True)
            report["skipped"] += labels
            report.setdefault("skipped_for_deadline", []).extend(labels)
            continue
        base = spec.get("baseline")
        if base is not None and base not in done:
            report["skipped"].append(row)            # nothing to compare against
            continue
        try:
            if pol not in warm:
                warm[pol] = warm_up(pol)
            tj = time.perf_counter()
            if len(group) > 1:
                _job(py + ["repro.rl.lockstep", "--artifact", art, "--rows", ",".join(r for r, _, _ in group),
                           "--profile", str(prof_file), "--out-root", str(out / art), "--warm-start", str(warm[pol])],
                     out / art / f"lockstep_{pol}.log")
            else:
                _job(py + ["repro.rl.run", "--artifact", art, "--row", row, "--profile", str(prof_file),
                           "--out", str(out / art / run_name), "--warm-start", str(warm[pol]), "--seed", "0"]
                     + (["--sampling-seed", str(seed)] if seed else []),
                     out / art / f"{run_name}.log")
            for r, _, _ in group:
                took[r] = time.perf_counter() - tj
            for r, k, name in group:
                last = json.loads((out / art / name / "run.json").read_text()).get("last")
                if not k:
                    done[r] = last
                report["rows"][name if k else r] = {"last_step": last, "elapsed_s": time.perf_counter() - t0}
        except Exception as exc:  # noqa: BLE001 -- one failing row must not lose the others' measurements
            traceback.print_exc()
            for label in labels:
                report["errors"][label] = f"{type(exc).__name__}: {exc}"
    finished = {r: s for r, s in rows.items() if r in done}
    if finished:
        try:
            skip = int(prof[art].get("skip_steps", 0))
            summary = summarize(art, finished, out / art, skip)
            with MetricsLogger(out / art / "summary", artifact=art, profile=args.profile,
                               config={"rows": finished, "skip_steps": skip}) as log:
                for r, m in summary.items():
                    log.log(m, row=r, step=0)
            write_json_atomic(out / art / "summary" / "summary.json", {"rows": summary})
            report["summary"] = summary
        except Exception as exc:  # noqa: BLE001 -- the rows stay on disk; the report says why
            traceback.print_exc()
            report["errors"]["summary"] = f"{type(exc).__name__}: {exc}"
    report["wall_s"] = time.perf_counter() - t0
    report["provenance"] = provenance()
    write_json_atomic(out / "gpu_rl.json", report)
    with tarfile.open(out / "h200_rl.tar.gz", "w:gz") as tar:
        for sub in (art, "sft"):
            if (out / sub).is_dir():
                for p in sorted((out / sub).rglob("*")):
                    if p.is_file() and p.suffix in (".json", ".jsonl", ".log"):
                        tar.add(p, arcname=str(p.relative_to(out)))
    for r, m in (report.get("summary") or {}).items():
        print(f"{r}: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(m.items())), flush=True)
    print(f"skipped: {report['skipped']}; errors: {list(report['errors'])}; wall {report['wall_s']:.0f}s")
    return 0 if not report["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
