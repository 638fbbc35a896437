"""repro.rl: GRPO with online draft co-training, the two workloads, and the runs behind Tables 1-2, Figs 3-4.

Modules (each has its own docstring with how to run it):
    config      run configuration, built from a profile section, validated before anything starts
    tokenizer   a byte-level BPE tokenizer trained locally on the workloads' text
    tasks/      single-turn math (DAPO-Math format) and the multi-turn workplace tool environment
    grpo        group-relative advantages, clipped policy loss, KL estimators
    joint       L = L_RL + lambda * L_draft(sg(taps)): optimizer groups, per-group clipping
    drafts      the three draft families as the loop uses them (build, propose, stop-gradient view of the head)
    episodes    rollouts of both workloads through the speculative engine, as training batches
    sft         the supervised warm start of the policy and the drafts' offline warm start, cached
    warmstart   building a run's policy and drafts from scratch or from the cached warm start
    checkpoint  atomic checkpoints and resume
    trainer     the co-training loop: rollout, reward, update, weight push, metrics, checkpoints
    run         command line entry of one training run (one table/figure row)
    summary     per-artifact summary rows (speedups, means of the first updates) from finished runs
    pp          the joint update under pipeline parallelism (stages, TapChannel, draft on the last stage)
    cp          the policy under context parallelism (ring attention in the HF model, a CP pipeline stage)
    mesh_update the joint update on a PP x CP mesh (1F1B pipelines of CP stages, one TapChannel per CP index)
    dist_parts  pieces pp, cp and mesh_update share (tap plumbing, cross-rank clipping, the row-wise GRPO loss)
    dist_run    torchrun entry of one row: rollout on rank 0, the mesh update on every rank, metrics
"""
