"""The suite drives NeMo-RL (Ray, Megatron policy workers, vLLM rollout) at paper scale.

NeMo-RL is never imported: the suite meets it at its config and metric boundaries.
    rows.py      the paper rows of a profile's ``nemo_rl:`` section, validated (RowSpec)
    config.py    RowSpec -> NeMo-RL GRPO config (overrides over one of NeMo-RL's example configs)
    skeleton.py  key/type skeleton of NeMo-RL's example configs; generated configs are checked against it
    upstream.py  NeMo-RL's own load_config + MasterConfig on every generated config, run in the checkout's
                 environment (``uv run`` of upstream_check.py), plus a strict DraftConfig key check; a
                 recorded commit's schema stands in where no checkout is given (CI)
    checks.py    everything a run needs (checkout and its draft stack, checkpoints, datasets, GPUs), checked
                 before anything is launched or submitted
    launch.py    the launch command: local ``uv run`` in the user's checkout, or SLURM through NeMo-RL's ray.sub
    runtime_env.py  the first step of a launch: env.json records the machine that runs NeMo-RL
    metrics.py   NeMo-RL's W&B metric names -> the suite's per-step names (registered with repro.report.collect)
    finish.py    after a run: the suite's per-step metrics.jsonl and the run.json marker
    run.py       the CLI: ``python -m integrations.nemo_rl.run --artifact table1 --row Qwen3-8B/DFlash ...``

    python -m integrations.nemo_rl.run --list        # every paper row and its launch command
"""
