# The rules that run measurements: each matches its output files to a job of the plan (repro/plan.py), which gives
# the command, inputs, log, threads and GPUs (run_job, common.smk). A job's settings digest is a parameter, so
# editing what a job reads from the profile reruns that job (and only it).


rule envcheck_run:
    output:
        f"{RUNS}/envcheck/bench.json",
    params:
        settings=lambda wc: job(f"{RUNS}/envcheck/bench.json").settings,
    resources:
        gpu=lambda wc: job(f"{RUNS}/envcheck/bench.json").gpus,
    run:
        run_job(output[0])


rule attention_check:
    # on GPU profiles, before fig5 and fig6: every attention path against the fp64 reference (fails when one does)
    output:
        f"{RUNS}/attention_check/attention_check.json",
    params:
        settings=lambda wc: job(f"{RUNS}/attention_check/attention_check.json").settings,
    resources:
        gpu=1,
    run:
        run_job(output[0])


rule bench_run:
    # fig5, fig6, fig7, decode: one benchmark program each, its settings in the profile's section
    input:
        lambda wc: of(f"{RUNS}/{{bench}}/bench.json")(wc).inputs,
    output:
        f"{RUNS}/{{bench}}/bench.json",
    wildcard_constraints:
        bench="|".join(BENCH_ARTIFACTS),
    params:
        settings=lambda wc: of(f"{RUNS}/{{bench}}/bench.json")(wc).settings,
    threads: lambda wc: of(f"{RUNS}/{{bench}}/bench.json")(wc).threads
    resources:
        gpu=lambda wc: of(f"{RUNS}/{{bench}}/bench.json")(wc).gpus,
    run:
        run_job(output[0])


rule rl_sft:
    # the SFT warm start of a policy on a workload, with every draft its rows run (shared by the RL artifacts)
    output:
        f"{RUNS}/sft/{{name}}/policy.pt",
    wildcard_constraints:
        name="[^/]+",
    params:
        settings=lambda wc: of(f"{RUNS}/sft/{{name}}/policy.pt")(wc).settings,
    resources:
        gpu=lambda wc: of(f"{RUNS}/sft/{{name}}/policy.pt")(wc).gpus,
    run:
        run_job(output[0])


import re as _re

# multi-node NeMo-RL rows submit NeMo-RL's ray.sub from where snakemake runs (rl_submit), never from inside a job
LOCAL_RUNS = "|".join(_re.escape(r) for r in PLAN.local_runs()) or "(?!x)x"


rule rl_run:
    # one co-training row (or a baseline's sampling-seed replica); run.json is written last, so a killed run
    # leaves its checkpoints and logged steps and the rerun resumes
    input:
        lambda wc: of(f"{RUNS}/{{artifact}}/{{run}}/run.json")(wc).inputs,
    output:
        f"{RUNS}/{{artifact}}/{{run}}/run.json",
    wildcard_constraints:
        artifact="|".join(RL_ARTIFACTS),
        run=f"(?!(?:{LOCAL_RUNS})/)[^/]+",
    params:
        settings=lambda wc: of(f"{RUNS}/{{artifact}}/{{run}}/run.json")(wc).settings,
    resources:
        gpu=lambda wc: of(f"{RUNS}/{{artifact}}/{{run}}/run.json")(wc).gpus,
        nodes=lambda wc: of(f"{RUNS}/{{artifact}}/{{run}}/run.json")(wc).nodes,
    run:
        run_job(output[0])


rule rl_submit:
    # a multi-node NeMo-RL row: submitted to SLURM (NeMo-RL's ray.sub, sbatch --wait) from where snakemake runs
    localrule: True
    output:
        f"{RUNS}/{{artifact}}/{{run}}/run.json",
    wildcard_constraints:
        artifact="|".join(RL_ARTIFACTS),
        run=LOCAL_RUNS,
    run:
        run_job(output[0])


rule rl_lockstep:
    # a policy's rows in one process, their steps interleaved (the artifact section's lockstep: true)
    input:
        lambda wc: of(f"{RUNS}/{{artifact}}/lockstep_{{policy}}.json")(wc).inputs,
    output:
        f"{RUNS}/{{artifact}}/lockstep_{{policy}}.json",
    wildcard_constraints:
        artifact="|".join(RL_ARTIFACTS),
        policy="[^/]+",
    params:
        settings=lambda wc: of(f"{RUNS}/{{artifact}}/lockstep_{{policy}}.json")(wc).settings,
    resources:
        gpu=lambda wc: of(f"{RUNS}/{{artifact}}/lockstep_{{policy}}.json")(wc).gpus,
    run:
        run_job(output[0])


rule rl_summary:
    localrule: True
    input:
        lambda wc: of(f"{RUNS}/{{artifact}}/summary/summary.json")(wc).inputs,
    output:
        f"{RUNS}/{{artifact}}/summary/summary.json",
    wildcard_constraints:
        artifact="|".join(RL_ARTIFACTS),
    run:
        run_job(output[0])
