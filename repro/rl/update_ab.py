"""The co-training update's overhead measured inside one process: drafted and no-draft updates interleaved.

Tables 1-2 define the update overhead across runs (the co-trained run's mean update time over its no-draft
run's), which on a launch-bound GPU also measures how fast each process happens to run (on the H200 the
same policy update differed 15-50% between processes; results/1xh200/h200/SESSION5.md). This measures
the same quantity within one process: round k runs a no-draft update of the trainer's policy (its own
optimizer, the same GRPO config) and then the trainer's joint update, on one rollout batch; adjacent
updates see the same process and device state. Both step the policy: this is a measurement after
training, not training.

    res = interleaved_update_ab(trainer, batch, advantages, rounds=8)
    res["overhead_pct"]          # 100 * (median over rounds of drafted / no-draft - 1)

``repro.rl.run`` runs it after training when the artifact section has ``ab_probe: {rounds: N}`` and logs
each round (``ab/update_no_draft_s``, ``ab/update_drafted_s``); ``repro.rl.summary`` reports
``update_overhead_ab_pct``. ``repro.bench.step_breakdown`` also times the drafted update with a graphed
draft step run eagerly (``variants``).
"""
from __future__ import annotations

from collections.abc import Callable

from repro.bench.common import summarize
from repro.rl.joint import JointUpdate
from repro.rl.summary import paired_overhead_pct


def interleaved_update_ab(trainer, batch, advantages, rounds: int, *, anchor_seed: int = 0,
                          variants: dict[str, Callable[[int], float]] | None = None) -> dict:
    """Per round: a no-draft update, the drafted update, then each of ``variants`` (name -> fn(round) -> seconds).
    Round 0 warms up (optimizer state, graph captures) and is not kept. Returns the samples, their summaries, the
    per-round ratios drafted / no-draft and ``overhead_pct`` (from the median ratio; adjacent updates share the
    process's speed, so the ratio is steadier than a ratio of medians, which is kept as ``overhead_of_medians_pct``)."""
    if trainer.draft is None:
        raise ValueError("interleaved_update_ab needs a co-training trainer (a row with a draft)")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    cfg, upd = trainer.cfg, trainer.update
    plain = JointUpdate(trainer.policy, None, cfg.grpo, None, trainer.reference, autocast_dtype=upd.autocast_dtype)

    def timed(u):
        return lambda k: u.step(batch, advantages, anchor_seed=anchor_seed + k,
                                temperature=cfg.grpo.temperature).update_time_s

    runs = {"no_draft": timed(plain), "drafted": timed(upd), **(variants or {})}
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for k in range(rounds + 1):
        for name, run in runs.items():
            t = run(k)
            if k:
                samples[name].append(t)
    ratios = [b / a for a, b in zip(samples["no_draft"], samples["drafted"])]
    sp, sd = summarize(samples["no_draft"]), summarize(samples["drafted"])
    return {"rounds": rounds, "samples": samples, "no_draft_s": sp, "drafted_s": sd, "ratios": ratios,
            "overhead_pct": paired_overhead_pct(samples["no_draft"], samples["drafted"]),
            "overhead_of_medians_pct": 100 * (sd["median"] / sp["median"] - 1),
            **{f"{name}_s": summarize(v) for name, v in samples.items() if name not in ("no_draft", "drafted")}}
