# Shared by table1, table2, fig3 and fig4 (included once by whichever of them comes first):
# the cached SFT warm start per (policy, workload), one co-training run per artifact row, and the
# artifact's summary rows. Rows, models and step counts come from the profile (rl: and <artifact>:).
from pathlib import Path as _Path

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


def rl_row_of(artifact, run):
    for row in rl_rows(artifact):
        if run_dir_name(row) == run:
            return row
    raise WorkflowError(f"no {artifact} row of profile {PROFILE_NAME} has run folder {run!r}")


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


def rl_warm_input(wildcards):
    return [] if PROFILE["engine"] == "nemo-rl" else [f"{rl_warm_dir(wildcards)}/policy.pt"]


def rl_run_markers(artifact):
    return [f"{RUNS}/{artifact}/{run_dir_name(r)}/run.json" for r in rl_rows(artifact)]


def rl_run_cmd(wildcards):
    row = rl_row_of(wildcards.artifact, wildcards.run)
    out = f"{RUNS}/{wildcards.artifact}/{wildcards.run}"
    if PROFILE["engine"] == "nemo-rl":
        if not NEMO_RL_RUN.is_file():
            return ("echo 'profile " + PROFILE_NAME + " runs its end-to-end rows through NeMo-RL, whose "
                    "driver (repro/nemo_rl/run.py) is not in this checkout; this rule only plans' >&2; exit 2")
        paths = "".join(f" --{flag} {config[key]}" for flag, key in (("nemo-rl-dir", "nemo_rl_dir"),
                                                                      ("checkpoint-root", "checkpoint_root"))
                        if config.get(key))
        return (f"{PY} -m repro.nemo_rl.run --artifact {wildcards.artifact} --row '{row}' "
                f"--profile {PROFILE_NAME} --out {out}{paths}")
    return (f"{PY} -m repro.rl.run --artifact {wildcards.artifact} --row '{row}' --profile {PROFILE_NAME} "
            f"--warm-start {rl_warm_dir(wildcards)} --out {out} --seed {config['seed']} --threads 1")


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
    # run.json is written last: a failed run leaves its checkpoint and logged steps, and the rerun resumes.
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
        f"{TIDY}/{PROFILE_NAME}/{{artifact}}.csv",
    output:
        f"{FIGS}/{{artifact}}.md",
    wildcard_constraints:
        artifact="table1|table2|fig3|fig4",
    params:
        cmd=lambda wc: report_cmd(wc.artifact),
    shell:
        "{params.cmd} && cat {output}"
