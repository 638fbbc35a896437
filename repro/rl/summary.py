"""Summary rows of Tables 1-2 and Figures 3-4 from finished co-training runs, logged like any measurement.

Reads each run folder's ``metrics.jsonl`` (the per-step rows written by ``repro.rl.run``), computes
the artifact's numbers under the paper's metric names and logs them through ``MetricsLogger`` into
``<runs>/summary`` (row = the paper's row label), so ``collect`` and ``compare`` treat them as any
other measurement (steps before ``skip_steps`` are warm-up and left out; Table 2 keeps the paper's "mean of the
first 10 updates" after that).

The definitions of every metric: docs/metrics.md.

Repeats (``--repeat DIR``, any number): the same rows run again with the same configuration (each row's
``env.json`` config must match, paths aside), e.g. a second device call of an artifact whose training reproduces bit
for bit. Every metric then pools the steps of all runs (each run's warm-up skipped on its own; lockstep pairs stay
paired), so a timing that the host's noise moves by ~10% per run gets more samples; ``acceptance_length_final``
averages each run's own last three steps; ``repeats`` counts the runs.

    python -m repro.rl.summary --artifact table1 --profile cpu-tiny --runs results/cpu-2c/cpu-tiny/table1
    python -m repro.rl.summary --artifact table1 --profile h200 --runs results/1xh200/h200/table1 \
        --repeat results/1xh200/h200/table1/repeat_s11 --rows "Qwen3-8B/no draft,Qwen3-8B/DFlash"
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from repro.core.io import write_json_atomic
from repro.core.layout import run_dir_name
from repro.core.metrics import SIDECAR, MetricsLogger, read_sidecar
from repro.core.profile import ProfileError, load_profile
from repro.core.specs import ARTIFACTS, ConfigError
from repro.rl.config import artifact_rows

TABLE2_STEPS = 10


def read_steps(run_dir: Path) -> list[dict]:
    """A run's per-step rows from its metrics.jsonl (NeMo-RL runs get one under the suite's names from
    integrations.nemo_rl.finish); a step logged twice (a resumed run) keeps its later row."""
    path = run_dir / SIDECAR
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; run the row first (python -m repro.rl.run ...)")
    latest: dict[int, dict] = {}
    for rec in read_sidecar(path):
        latest[int(rec["step"])] = rec
    return [latest[s] for s in sorted(latest)]


PATH_KEYS = ("out", "warm_start")   # config entries that name where a run wrote or read, not what it ran


def check_same_config(run_dir: Path, repeat_dir: Path) -> None:
    """ValueError naming the first configuration entry (paths aside) in which ``repeat_dir``'s run differs from
    ``run_dir``'s, so only repeats of one configuration are pooled."""
    def config(d: Path) -> dict:
        env = d / "env.json"
        if not env.is_file():
            raise FileNotFoundError(f"{env}: missing; a repeat needs the run folder as repro.rl.run wrote it")
        return {k: v for k, v in json.loads(env.read_text()).get("config", {}).items() if k not in PATH_KEYS}
    a, b = config(run_dir), config(repeat_dir)
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            raise ValueError(f"{repeat_dir} is not a repeat of {run_dir}: config {key!r} is {b.get(key)!r}, "
                             f"expected {a.get(key)!r}")


def _mean(xs: list[float]) -> float:
    if not xs:
        raise ValueError("no steps to average (is skip_steps >= the number of steps?)")
    return sum(xs) / len(xs)


def _col(steps: list[dict], key: str) -> list[float]:
    return [float(s[key]) for s in steps if key in s]


def _per_token(steps: list[dict], time_key: str, update: tuple[str, float] | None = None) -> float:
    """Generated tokens per second of ``time_key``; steps per second when tokens are not logged. ``update``
    (an update-time key, seconds): as if every step's update had taken those seconds instead of its own."""
    t = sum(_col(steps, time_key))
    if update is not None:
        key, seconds = update
        t += seconds * len(steps) - sum(_col(steps, key))
    if t <= 0:
        raise ValueError(f"no {time_key} logged")
    tokens = _col(steps, "train/gen_tokens")
    return (sum(tokens) if len(tokens) == len(steps) else len(steps)) / t


def overhead_interval_pct(baseline: list[float], drafted: list[float], level: float = 0.95, resamples: int = 2000,
                          seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of 100 * (mean(drafted) / mean(baseline) - 1) over the steps. Equally many
    steps are resampled as pairs (step i of lockstep rows shares a time window), otherwise each side on its own."""
    if not baseline or not drafted:
        raise ValueError(f"need steps on both sides, got {len(baseline)} baseline and {len(drafted)} drafted")
    if not 0 < level < 1:
        raise ValueError(f"level {level} is invalid: expected a fraction in (0, 1)")
    rng = random.Random(seed)
    paired = len(baseline) == len(drafted)
    stats = []
    for _ in range(resamples):
        i = [rng.randrange(len(drafted)) for _ in drafted]
        j = i if paired else [rng.randrange(len(baseline)) for _ in baseline]
        stats.append(100.0 * (_mean([drafted[k] for k in i]) / _mean([baseline[k] for k in j]) - 1))
    stats.sort()
    tail = (1 - level) / 2
    return stats[int(tail * (resamples - 1))], stats[int(round((1 - tail) * (resamples - 1)))]


BASES = {"wall": ("train/rollout_time_s", "train/update_time_s", "train/step_time_s"),
         "cpu": ("train/rollout_cpu_s", "train/update_cpu_s", "train/step_cpu_s")}
# warm-up work an averaged step did (its times hold it): the summary's count of such steps, the per-step metric
# it counts, and the warning's words for what the steps did and what their times include
WARM_UP_LEFT = (("averaged_steps_compiling", "train/compiled_graphs", "compiled graphs", "the compilation"),
                ("averaged_steps_capturing", "train/step_graph_captures", "captured CUDA graphs", "the captures"))


def summarize(artifact: str, rows: dict[str, dict], runs: Path, skip_steps: int = 0,
              basis: str = "wall", repeats: Sequence[Path] = ()) -> dict[str, dict[str, float]]:
    """{row label: {metric: value}} for ``artifact`` from the run folders under ``runs``.

    ``basis`` is the time the speedups and the update overhead are computed from: ``wall`` (GPUs,
    dedicated machines) or ``cpu`` (process CPU seconds plus tool latency: shared CPU machines, where
    other processes inflate wall time at random). The times (``rollout_time_s``, ``update_time_s``,
    ``step_time_s``) are on the same basis; with ``cpu`` the wall-time values are logged too (``*_wall``).
    ``repeats``: folders holding the same rows run again; their steps are pooled with those under ``runs``.
    """
    if basis not in BASES:
        raise ValueError(f"basis {basis!r} is not one of {sorted(BASES)}")
    steps, probes, finals = {}, {}, {}
    for row in rows:
        steps[row], probes[row], finals[row] = [], [], []
        for root in (runs, *repeats):
            if root != runs:
                check_same_config(runs / run_dir_name(row), root / run_dir_name(row))
            everything = read_steps(root / run_dir_name(row))
            probes[row] += [x for x in everything if "pp/tap_wait_s" in x]         # PP probe rows, after training
            s = [x for x in everything if "pp/tap_wait_s" not in x][skip_steps:]
            if artifact == "table2":
                s = s[:TABLE2_STEPS]
            if not s:
                raise ValueError(f"row {row!r} in {root}: no steps left after skip_steps={skip_steps}")
            steps[row] += s
            finals[row].append(_col(s, "train/acceptance_length")[-3:])
    out: dict[str, dict[str, float]] = {}
    for row, spec in rows.items():
        s, m = steps[row], {}
        base = spec.get("baseline")
        if base is not None and base not in steps:
            raise ConfigError(f"{artifact} row {row!r} names baseline {base!r}, which is not a row")
        for name, key in zip(("rollout_time_s", "update_time_s", "step_time_s"), BASES[basis]):
            m[name] = _mean(_col(s, key))
        if basis != "wall":
            for name, key in zip(("rollout_time_s", "update_time_s", "step_time_s"), BASES["wall"]):
                m[name + "_wall"] = _mean(_col(s, key))
        for name, key, _, _ in WARM_UP_LEFT:
            counts = _col(s, key)
            if counts:
                m[name] = float(sum(1 for c in counts if c > 0))
        m["train_inference_kl"] = _mean(_col(s, "train/train_inference_kl"))
        m["reward"] = _mean(_col(s, "train/reward"))
        if _col(s, "train/tap_wait_s"):
            m["tap_wait_s"] = _mean(_col(s, "train/tap_wait_s"))
        elif probes[row]:
            m["tap_wait_s"] = _mean(_col(probes[row], "pp/tap_wait_s"))
            m["pp_update_time_s"] = _mean(_col(probes[row], "pp/update_time_s"))
        record = runs / run_dir_name(row) / "run.json"
        lockstep = json.loads(record.read_text()).get("lockstep_rows") if record.exists() else None
        if lockstep:
            m["lockstep_rows"] = float(len(lockstep))
        if spec.get("draft"):
            al = _col(s, "train/acceptance_length")
            m["acceptance_length"] = _mean(al)
            m["acceptance_length_final"] = _mean([_mean(f) for f in finals[row]])
        if repeats:
            m["repeats"] = float(1 + len(repeats))
        names = [("", basis)] + ([("_wall", "wall")] if basis != "wall" else [])
        for suffix, b_name in names:
            r_key, u_key, s_key = BASES[b_name]
            if not _col(s, r_key):
                raise ValueError(f"row {row!r}: no {r_key} logged (time basis {b_name!r})")
            if base is not None:
                b = steps[base]
                m["rollout_speedup" + suffix] = _per_token(s, r_key) / _per_token(b, r_key)
                m["e2e_speedup" + suffix] = _per_token(s, s_key) / _per_token(b, s_key)
                m["e2e_speedup_free_draft_update" + suffix] = (
                    _per_token(s, s_key, update=(u_key, _mean(_col(b, u_key)))) / _per_token(b, s_key))
                m["update_overhead_pct" + suffix] = 100.0 * (_mean(_col(s, u_key)) / _mean(_col(b, u_key)) - 1)
                if not suffix:
                    low, high = overhead_interval_pct(_col(b, u_key), _col(s, u_key))
                    m["update_overhead_ci95_low_pct"], m["update_overhead_ci95_high_pct"] = low, high
            else:
                m["rollout_share_of_step_pct" + suffix] = 100.0 * sum(_col(s, r_key)) / sum(_col(s, s_key))
        out[row] = m
    if artifact in ("fig3", "fig4"):
        drafted = [m for r, m in out.items() if rows[r].get("draft")]
        allrow = {"train_inference_kl": max(m["train_inference_kl"] for m in out.values())}
        if drafted:
            for k in ("acceptance_length_final", "e2e_speedup", "rollout_speedup"):
                if any(k in m for m in drafted):          # speedups need the baseline, which may not have run
                    allrow[k] = _mean([m[k] for m in drafted if k in m])
        base_rows = [m for r, m in out.items() if not rows[r].get("draft")]
        if base_rows:
            allrow["rollout_share_of_step_pct"] = _mean([m["rollout_share_of_step_pct"] for m in base_rows])
        out["all"] = allrow
    if artifact == "table2":
        base = [r for r, spec in rows.items() if not spec.get("draft")]
        for r in base:
            out[r]["rollout_speedup"] = out[r]["e2e_speedup"] = 1.0
    return out


def runs_hardware(runs: Path, rows: dict[str, dict]) -> dict | None:
    """The hardware record (as detected by the runs) of the rows' run folders; None when no run folder has one
    (runs logged by other engines); ValueError when the rows ran on different hardware."""
    seen = {}
    for row in rows:
        env = runs / run_dir_name(row) / "env.json"
        if env.exists():
            hw = json.loads(env.read_text()).get("hardware")
            if hw:
                seen[row] = hw
    tags = {hw.get("tag") for hw in seen.values()}
    if len(tags) > 1:
        raise ValueError(f"the rows under {runs} ran on different hardware ({sorted(map(str, tags))}); "
                         "expected one machine per summary")
    return next(iter(seen.values()), None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", required=True, choices=ARTIFACTS)
    ap.add_argument("--profile", default="cpu-tiny")
    ap.add_argument("--runs", required=True, type=Path, help="folder holding one run folder per row")
    ap.add_argument("--out", type=Path, default=None, help="summary run folder (default: <runs>/summary)")
    ap.add_argument("--basis", choices=sorted(BASES), default=None,
                    help="time basis of speedups (default: cpu on CPU profiles, wall on GPU profiles)")
    ap.add_argument("--repeat", type=Path, action="append", default=[], metavar="DIR",
                    help="a folder with the same rows run again in the same configuration (repeatable); their steps "
                         "are pooled with --runs' (more samples of noisy timings)")
    ap.add_argument("--rows", default="", help="comma-separated rows to summarise (default: every row of the artifact; "
                    "e.g. the rows one device call ran)")
    args = ap.parse_args(argv)
    try:
        prof = load_profile(args.profile)
        rows = artifact_rows(prof, args.artifact)
        if args.rows:
            wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
            bad = [r for r in wanted if r not in rows]
            if bad:
                raise ConfigError(f"--rows {bad} are not {args.artifact} rows of profile {args.profile!r}; "
                                  f"expected some of {list(rows)}")
            rows = {r: rows[r] for r in wanted}
        skip = int(prof[args.artifact].get("skip_steps", 0))
        basis = args.basis or ("cpu" if prof["hardware"]["device"] == "cpu" else "wall")
        result = summarize(args.artifact, rows, args.runs, skip, basis, args.repeat)
        measured_on = runs_hardware(args.runs, rows)
        for root in args.repeat:
            if (runs_hardware(root, rows) or {}).get("tag") != (measured_on or {}).get("tag"):
                raise ValueError(f"--repeat {root} ran on other hardware than --runs {args.runs}")
    except (ConfigError, ProfileError, FileNotFoundError, ValueError) as exc:
        print(f"summary: error: {exc}", file=sys.stderr)
        return 2
    out = args.out or args.runs / "summary"
    with MetricsLogger(out, artifact=args.artifact, profile=prof["name"], measured_on=measured_on,
                       config={"rows": rows, "skip_steps": skip, "runs": str(args.runs), "basis": basis,
                               "repeats": [str(r) for r in args.repeat]}) as log:
        for row, metrics in result.items():
            log.log(metrics, row=row, step=0)
    write_json_atomic(out / "summary.json", {"artifact": args.artifact, "profile": prof["name"],
                                             "skip_steps": skip, "basis": basis,
                                             "repeats": [str(r) for r in args.repeat], "rows": result})
    width = max(len(r) for r in result)
    for row, metrics in result.items():
        print(f"{row:<{width}}  " + "  ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
    for row, metrics in result.items():
        for name, key, did, work in WARM_UP_LEFT:
            if metrics.get(name):
                print(f"summary: warning: row {row!r}: {metrics[name]:.0f} of the averaged steps {did} (their times "
                      f"include {work}; see {key} in its metrics.jsonl)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
