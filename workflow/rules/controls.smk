# Draft controls: not paper artifacts, the experiments that say what co-training itself adds (not part of `all`).
#   draft_frozen     fig3's and fig4's drafted rows from the workflow's SFT warm starts, drafts co-trained
#                    (draft.loss_weight 1) and frozen (0): repro.rl.draft_sweep, then repro.report.sweep_report.
#   draft_offdomain  fig4's drafted rows with the drafts warm-started on the math workload (the paper's drafts come
#                    from other data than the RL task), co-trained and frozen: scripts/experiments/draft_offdomain.sh.
#   exchangeability  fig3's no-draft, EAGLE-3 and DSpark rows over 8 sampling seeds each, and whether the co-trained
#                    runs' mean reward and validation accuracy differ from the no-draft runs' (exact permutation
#                    test): scripts/experiments/exchangeability.sh, repro.report.exchangeability.
#   cotrain_checks   on this machine, in the profile's dtype and rollout mode: speculative sampling draws the
#                    policy's law (chi-square per family and a no-draft control) and the joint update leaves the policy
#                    bit-identical to the no-draft update: repro.bench.cotrain_checks (fails when a check fails).
#   workload_law     from fig3's SFT warm start, the rollout with each draft against no draft on the math workload
#                    (reward, teacher-forced token log-probability, length): repro.bench.workload_law.
# Outputs in results/<hw>/<profile>/draft_{frozen,offdomain}/: sweep.json per sweep, report.{md,png,json};
# results/<hw>/<profile>/exchangeability/report.{md,json}; results/<hw>/<profile>/cotrain_checks/cotrain_checks.json;
# results/<hw>/<profile>/workload_law/workload_law.json.
# The suite trains these rows in single processes, so profiles whose rows run on NeMo-RL or load checkpoints
# refuse them with a message.
if "RL_RULES_INCLUDED" not in globals():

    include: "rl.smk"


CONTROL_ARTIFACTS = ("fig3", "fig4")


def control_rows(artifact):
    return [r for r, spec in rl_rows(artifact).items() if (spec or {}).get("draft")]


def controls_refusal():
    """Why this profile cannot run the controls, or '' when it can."""
    if ENGINE != "suite":
        return f"engine {ENGINE} (the controls run on the suite's own trainer)"
    for a in CONTROL_ARTIFACTS:
        if not control_rows(a):
            return f"no drafted {a} rows"
        if any(rl_policy_entry(a, r).get("checkpoint") for r in control_rows(a)):
            return f"{a} rows load checkpoints (no SFT warm start to compare from)"
    return ""


CONTROL_JOBS = 2      # runs at once (each single-threaded)


def sweep_cmd(artifact, out, warm):
    return (f"{PY} -m repro.rl.draft_sweep --profile {PROFILE_NAME} --artifact {artifact} "
            f"--rows '{','.join(control_rows(artifact))}' --key loss_weight --values 0,1 --warm-start {warm} "
            f"--seed {config['seed']} --jobs {CONTROL_JOBS} --out {out}")


def report_cmd_of(sweeps, out):
    return f"{PY} -m repro.report.sweep_report {' '.join(sweeps)} --out-dir {out} --name report"


if not controls_refusal():
    FROZEN = f"{RUNS}/draft_frozen"
    OFFDOMAIN = f"{RUNS}/draft_offdomain"
    EXCHANGE = f"{RUNS}/exchangeability"
    EXCHANGE_WORK = f".cache/exchangeability/{PROFILE_NAME}"   # the run folders: outside results/, so never collected
    CHECKS = f"{RUNS}/cotrain_checks"
    WORKLOAD_LAW = f"{RUNS}/workload_law"

    rule workload_law:
        input:
            f"{SFT_DIR}/dense-math/policy.pt",
        output:
            f"{WORKLOAD_LAW}/workload_law.json",
        log:
            f"{WORKLOAD_LAW}/workload_law.log",
        shell:
            "{PY} -m repro.bench.workload_law --out {WORKLOAD_LAW} --profile {PROFILE_NAME} "
            "--warm-start {SFT_DIR}/dense-math > {log} 2>&1"

    rule cotrain_checks:
        output:
            f"{CHECKS}/cotrain_checks.json",
        log:
            f"{CHECKS}/cotrain_checks.log",
        shell:
            "{PY} -m repro.bench.cotrain_checks --out {CHECKS} --profile {PROFILE_NAME} > {log} 2>&1"

    rule draft_frozen:
        input:
            [f"{SFT_DIR}/dense-{rl_workload(a)}/policy.pt" for a in CONTROL_ARTIFACTS],
        output:
            [f"{FROZEN}/{a}/sweep.json" for a in CONTROL_ARTIFACTS],
            f"{FROZEN}/report.md",
        log:
            f"{FROZEN}/draft_frozen.log",
        threads: CONTROL_JOBS
        params:
            cmd=" && ".join([sweep_cmd(a, f"{FROZEN}/{a}", f"{SFT_DIR}/dense-{rl_workload(a)}")
                             for a in CONTROL_ARTIFACTS]
                            + [report_cmd_of([f"{FROZEN}/{a}/sweep.json" for a in CONTROL_ARTIFACTS], FROZEN)]),
        shell:
            "({params.cmd}) > {log} 2>&1"

    rule draft_offdomain:
        output:
            f"{OFFDOMAIN}/sweep.json",
            f"{OFFDOMAIN}/report.md",
        log:
            f"{OFFDOMAIN}/draft_offdomain.log",
        threads: CONTROL_JOBS
        shell:
            "(OUT={OFFDOMAIN} PROFILE={PROFILE_NAME} PY={PY} JOBS={CONTROL_JOBS} "
            "bash scripts/experiments/draft_offdomain.sh && "
            + report_cmd_of([f"{OFFDOMAIN}/sweep.json"], OFFDOMAIN)
            + ") > {log} 2>&1"

    rule exchangeability:
        input:
            f"{SFT_DIR}/dense-{rl_workload('fig3')}/policy.pt",
        output:
            f"{EXCHANGE}/report.json",
            f"{EXCHANGE}/report.md",
        log:
            f"{EXCHANGE}/exchangeability.log",
        threads: CONTROL_JOBS
        shell:
            # a rerun means its inputs changed: the runs of an earlier one are stale, so they go first
            "(rm -rf {EXCHANGE_WORK} && OUT={EXCHANGE} PROFILE={PROFILE_NAME} PY={PY} JOBS={CONTROL_JOBS} "
            "WARM={SFT_DIR}/dense-" + rl_workload("fig3") + " WORK={EXCHANGE_WORK} "
            "bash scripts/experiments/exchangeability.sh) > {log} 2>&1"

else:

    rule draft_frozen:
        shell:
            f"echo 'profile {PROFILE_NAME} cannot run draft_frozen: {controls_refusal()}' >&2; exit 1"

    rule draft_offdomain:
        shell:
            f"echo 'profile {PROFILE_NAME} cannot run draft_offdomain: {controls_refusal()}' >&2; exit 1"

    rule exchangeability:
        shell:
            f"echo 'profile {PROFILE_NAME} cannot run exchangeability: {controls_refusal()}' >&2; exit 1"

    rule cotrain_checks:
        shell:
            f"echo 'profile {PROFILE_NAME} cannot run cotrain_checks: {controls_refusal()}' >&2; exit 1"

    rule workload_law:
        shell:
            f"echo 'profile {PROFILE_NAME} cannot run workload_law: {controls_refusal()}' >&2; exit 1"
