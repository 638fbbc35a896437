# Shared by table1, table2, fig3 and fig4 (included once by whichever of them comes first):
# the cached SFT warm start per (policy, workload), one co-training run per artifact row, and the
# artifact's summary rows. Rows, models and step counts come from the profile (rl: and <artifact>:).
# fig3/fig4 sections may add baseline_seeds: [k, ...]: the baseline row run again with sampling seed k (same
# prompts, held-out split and warm start) into <row folder>_sampling<k> (repro.report.seed_spread draws and judges
# the band of those runs).
# ENGINE (common.smk: --config engine=, default the profile's own) picks who runs a row: NeMo-RL
# (repro.nemo_rl.run) or the suite (repro.rl). On the suite, a row whose policy loads a checkpoint (the
# paper profiles' rl: section) has no SFT warm start and runs under torchrun on its policy's mesh
# (repro.rl.dist_run, pp * cp processes on one node); the others run in one process (repro.rl.run), or, when the
# artifact section says lockstep: true, one process per policy trains all its rows with their steps interleaved
# (repro.rl.lockstep; the profile's GPU sections do, since host speed drifts between processes).
from pathlib import Path as _Path

from repro.report.seed_spread import replica_run_name
from repro.rl.summary import run_dir_name

RL_RULES_INCLUDED = True
RL_ARTIFACTS = ("table1", "table2", "fig3", "fig4")
SFT_DIR = f"{RUNS}/sft"
NEMO_RL_RUN = _Path(workflow.basedir, "repro", "nemo_rl", "run.py")


def rl_rows(artifact):
    return dict((PROFILE.get(artifact) or {}).get("rows") or {})


def rl_workload(artifact):
    section = PROFILE.get(artifact) or {}
    return (section.get("workload") or {}).get("name") or ((PROFILE.get("rl") or {}).get("workload") or {}).get(
        "name", "math")


def rl_baseline_row(artifact):
    """The row every drafted row of ``artifact`` names as its baseline (needed only with baseline_seeds)."""
    named = sorted({(spec or {}).get("baseline") for spec in rl_rows(artifact).values()} - {None})
    if len(named) != 1 or named[0] not in rl_rows(artifact):
        raise WorkflowError(f"profile {PROFILE_NAME}: {artifact}.baseline_seeds needs the rows to name one "
                            f"baseline row; they name {named}")
    return named[0]


def rl_seed_runs(artifact):
    """{run folder: (baseline row, sampling seed)} of the baseline's replicas (the workflow seed is the main run)."""
    seeds = (PROFILE.get(artifact) or {}).get("baseline_seeds") or []
    if not seeds:
        return {}
    if ENGINE == "nemo-rl":
        raise WorkflowError(f"profile {PROFILE_NAME}: {artifact}.baseline_seeds is for the suite engine; the "
                            "NeMo-RL driver takes no seed from this workflow (remove baseline_seeds)")
    row = rl_baseline_row(artifact)
    return {replica_run_name(run_dir_name(row), int(k)): (row, int(k))
            for k in dict.fromkeys(seeds) if int(k) != int(config["seed"])}


def rl_row_seed(artifact, run):
    """(row, sampling seed) run in folder ``run``: a row's main run (None: the workflow seed samples too) or a
    baseline replica."""
    for row in rl_rows(artifact):
        if run_dir_name(row) == run:
            return row, None
    if run in rl_seed_runs(artifact):
        return rl_seed_runs(artifact)[run]
    raise WorkflowError(f"no {artifact} row (or baseline seed replica) of profile {PROFILE_NAME} has run "
                        f"folder {run!r}")


def rl_row_of(artifact, run):
    return rl_row_seed(artifact, run)[0]


def rl_sft_drafts(policy, workload):
    """Every draft some row runs with this policy on this workload (all warm-started in one job)."""
    names = set()
    for a in RL_ARTIFACTS:
        if rl_workload(a) != workload:
            continue
        for spec in rl_rows(a).values():
            if (spec or {}).get("policy", "dense") == policy and (spec or {}).get("draft"):
                names.add(spec["draft"])
    return ",".join(sorted(names))


def rl_warm_dir(wildcards):
    spec = rl_rows(wildcards.artifact)[rl_row_of(wildcards.artifact, wildcards.run)] or {}
    return f"{SFT_DIR}/{spec.get('policy', 'dense')}-{rl_workload(wildcards.artifact)}"


def rl_policy_entry(artifact, row):
    """The row's policy in the profile's rl.policies ({} when the profile has none)."""
    name = (rl_rows(artifact)[row] or {}).get("policy", "dense")
    return ((PROFILE.get("rl") or {}).get("policies") or {}).get(name) or {}


def rl_warm_input(wildcards):
    row = rl_row_of(wildcards.artifact, wildcards.run)
    if ENGINE == "nemo-rl" or rl_policy_entry(wildcards.artifact, row).get("checkpoint"):
        return []          # NeMo-RL, or a checkpoint policy: it starts from its checkpoint, no SFT
    return [f"{rl_warm_dir(wildcards)}/policy.pt"]


def rl_lockstep_groups(artifact):
    """{policy: its rows, no-draft first} when the artifact section asks for lockstep (repro.rl.lockstep), else {}."""
    if not (PROFILE.get(artifact) or {}).get("lockstep"):
        return {}
    rows = rl_rows(artifact)
    if ENGINE == "nemo-rl" or any(rl_policy_entry(artifact, r).get("checkpoint") for r in rows):
        raise WorkflowError(f"profile {PROFILE_NAME}: {artifact}.lockstep is for rows the suite trains in one "
                            "process (no NeMo-RL engine, no checkpoint policies on a torchrun mesh); remove it")
    groups = {}
    for row in sorted(rows, key=lambda r: bool((rows[r] or {}).get("draft"))):
        groups.setdefault((rows[row] or {}).get("policy", "dense"), []).append(row)
    return groups


def rl_run_markers(artifact):
    groups = rl_lockstep_groups(artifact)
    main = ([f"{RUNS}/{artifact}/lockstep_{policy}.json" for policy in groups] if groups
            else [f"{RUNS}/{artifact}/{run_dir_name(r)}/run.json" for r in rl_rows(artifact)])
    return main + [f"{RUNS}/{artifact}/{run}/run.json" for run in rl_seed_runs(artifact)]


def rl_run_cmd(wildcards):
    row, sampling = rl_row_seed(wildcards.artifact, wildcards.run)
    seed = f"--seed {config['seed']}" + ("" if sampling is None else f" --sampling-seed {sampling}")
    out = f"{RUNS}/{wildcards.artifact}/{wildcards.run}"
    if ENGINE == "nemo-rl":
        if not NEMO_RL_RUN.is_file():
            return ("echo 'profile " + PROFILE_NAME + " runs its end-to-end rows through NeMo-RL, whose "
                    "driver (repro/nemo_rl/run.py) is not in this checkout; this rule only plans' >&2; exit 2")
        paths = "".join(f" --{flag} {config[key]}" for flag, key in (("nemo-rl-dir", "nemo_rl_dir"),
                                                                      ("checkpoint-root", "checkpoint_root"))
                        if config.get(key))
        return (f"{PY} -m repro.nemo_rl.run --artifact {wildcards.artifact} --row '{row}' "
                f"--profile {PROFILE_NAME} --out {out}{paths}")
    engine = "" if PROFILE["engine"] == "suite" else " --engine suite"   # a nemo-rl profile on the suite
    policy = rl_policy_entry(wildcards.artifact, row)
    if policy.get("checkpoint"):
        mesh = policy.get("mesh")
        if not mesh:
            name = (rl_rows(wildcards.artifact)[row] or {}).get("policy")
            raise WorkflowError(f"profile {PROFILE_NAME}: rl.policies.{name} loads a checkpoint but has no "
                                "mesh: {pp, cp}, the layout of its torchrun run (repro.rl.dist_run)")
        return (f"{PY} -m torch.distributed.run --standalone --nproc-per-node {mesh['pp'] * mesh['cp']} "
                f"-m repro.rl.dist_run --artifact {wildcards.artifact} --row '{row}' --profile {PROFILE_NAME}"
                f"{engine} --checkpoint-root {config['checkpoint_root']} --pp {mesh['pp']} --cp {mesh['cp']} "
                f"--out {out} {seed} --log-artifact artifact")
    return (f"{PY} -m repro.rl.run --artifact {wildcards.artifact} --row '{row}' --profile {PROFILE_NAME}{engine} "
            f"--warm-start {rl_warm_dir(wildcards)} --out {out} {seed} --threads 1 --restart-on-config-change")


rule rl_sft:
    output:
        f"{SFT_DIR}/{{policy}}-{{workload}}/policy.pt",
    log:
        f"{SFT_DIR}/{{policy}}-{{workload}}.log",
    params:
        drafts=lambda wc: rl_sft_drafts(wc.policy, wc.workload),
    threads: 1
    shell:
        "{PY} -m repro.rl.sft --profile {PROFILE_NAME} --policy {wildcards.policy} "
        "--workload {wildcards.workload} --drafts '{params.drafts}' --seed {config[seed]} --threads {threads} "
        "--out {SFT_DIR}/{wildcards.policy}-{wildcards.workload} > {log} 2>&1"


rule rl_run:
    # run.json is written last: a failed run leaves its checkpoint and logged steps, and the rerun resumes (unless
    # the profile changed in between: then the run starts over).
    input:
        rl_warm_input,
    output:
        f"{RUNS}/{{artifact}}/{{run}}/run.json",
    log:
        f"{RUNS}/{{artifact}}/{{run}}.log",
    wildcard_constraints:
        artifact="table1|table2|fig3|fig4",
        run="[a-z0-9._-]+",
    params:
        cmd=rl_run_cmd,
    threads: 1
    shell:
        "{params.cmd} > {log} 2>&1"


rule rl_lockstep:
    # one process trains the policy's rows with their steps interleaved; each row's folder is as rl_run's, and the
    # record is written last (a failed job leaves checkpoints and logged steps, and the rerun resumes every row)
    input:
        lambda wc: f"{SFT_DIR}/{wc.policy}-{rl_workload(wc.artifact)}/policy.pt",
    output:
        f"{RUNS}/{{artifact}}/lockstep_{{policy}}.json",
    log:
        f"{RUNS}/{{artifact}}/lockstep_{{policy}}.log",
    wildcard_constraints:
        artifact="table1|table2|fig3|fig4",
        policy="[a-z0-9_-]+",
    params:
        rows=lambda wc: ",".join(rl_lockstep_groups(wc.artifact)[wc.policy]),
        warm=lambda wc: f"{SFT_DIR}/{wc.policy}-{rl_workload(wc.artifact)}",
    threads: 1
    shell:
        "{PY} -m repro.rl.lockstep --artifact {wildcards.artifact} --rows '{params.rows}' --profile {PROFILE_NAME} "
        "--warm-start {params.warm} --out-root {RUNS}/{wildcards.artifact} --seed {config[seed]} --threads 1 "
        "--record {output} --restart-on-config-change > {log} 2>&1"


rule rl_summary:
    input:
        lambda wc: rl_run_markers(wc.artifact),
    output:
        f"{RUNS}/{{artifact}}/summary/summary.json",
    log:
        f"{RUNS}/{{artifact}}/summary.log",
    wildcard_constraints:
        artifact="table1|table2|fig3|fig4",
    shell:
        "{PY} -m repro.rl.summary --artifact {wildcards.artifact} --profile {PROFILE_NAME} "
        "--runs {RUNS}/{wildcards.artifact} > {log} 2>&1 && cat {log}"


rule rl_report:
    input:
        unpack(lambda wc: report_input(wc.artifact)),
    output:
        f"{FIGS}/{{artifact}}.md",
    wildcard_constraints:
        artifact="table1|table2|fig3|fig4",
    params:
        cmd=lambda wc: report_cmd(wc.artifact),
    shell:
        "{params.cmd} && cat {output}"
