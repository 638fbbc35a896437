"""After a NeMo-RL run: its steps under the suite's names (metrics.jsonl) and the run.json marker.

The suite's own runs leave, besides their W&B logs, a ``metrics.jsonl`` of per-step rows
(``{"row", "step", "train/...": value}``) that the artifact summaries read (repro/rl/summary.py), and
a ``run.json`` written last, which the workflow takes as "this row finished". A NeMo-RL run folder gets
the same two files from its W&B logs (read with the suite's reader, mapped by integrations.nemo_rl.metrics);
collect then reads its metrics.jsonl as a suite run's (the W&B logs until it exists). integrations.nemo_rl.run
calls this when NeMo-RL exits 0; after launching NeMo-RL yourself (--config-only), run it by hand.

    python -m integrations.nemo_rl.finish results/8xh100/paper-h100/table1/qwen3-8b_dflash
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from integrations.nemo_rl.metrics import step_metrics
from repro.core.io import write_atomic, write_json_atomic
from repro.core.wandb_reader import WandbLogError, find_wandb_logs, read_wandb_log


def steps_of(run_dir: Path, row: str) -> list[dict[str, Any]]:
    """The run's per-step rows under the suite's names; a resumed run's later log wins per step."""
    logs = find_wandb_logs(run_dir)
    if not logs:
        raise FileNotFoundError(f"{run_dir}: no W&B log (wandb/*run-*/run-*.wandb under it); did NeMo-RL run "
                                "with logger.wandb_enabled and WANDB_MODE offline or online?")
    by_step: dict[int, dict[str, float]] = {}
    for log in logs:
        for entry in read_wandb_log(log).history:
            metrics = step_metrics(entry)
            if metrics and "_step" in entry:
                by_step.setdefault(int(entry["_step"]), {}).update(metrics)
    return [{"row": row, "step": step, **by_step[step]} for step in sorted(by_step)]


def finish(run_dir: Path, command_rc: int = 0) -> Path:
    """Write metrics.jsonl and then run.json into ``run_dir`` (whose env.json names artifact and row)."""
    env = json.loads((Path(run_dir) / "env.json").read_text())
    missing = [k for k in ("artifact", "row", "profile") if k not in env]
    if missing:
        raise ValueError(f"{run_dir}/env.json has no {', '.join(missing)}: "
                         "not a run folder of integrations.nemo_rl.run")
    rows = steps_of(Path(run_dir), env["row"])
    if not rows:
        raise ValueError(f"{run_dir}: the W&B logs hold no NeMo-RL step metrics (did the run reach step 1?)")
    write_atomic(Path(run_dir) / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return write_json_atomic(Path(run_dir) / "run.json", {
        "artifact": env["artifact"], "row": env["row"], "profile": env["profile"], "engine": env.get("engine"),
        "steps": len(rows), "last": rows[-1], "returncode": command_rc})


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m integrations.nemo_rl.finish RUN_DIR", file=sys.stderr)
        return 2
    try:
        path = finish(Path(args[0]))
    except (OSError, KeyError, ValueError, WandbLogError) as exc:
        print(f"integrations.nemo_rl.finish: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path.parent / 'metrics.jsonl'} and {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
