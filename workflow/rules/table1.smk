# table1: the co-training rows of this profile (experiments/profiles/<profile>.yaml, section table1:), their
# summary (repro.rl.summary) and the table with the paper's values beside ours (repro.report.artifacts.table1).
if "RL_RULES_INCLUDED" not in globals():

    include: "rl.smk"


if rl_rows("table1"):

    register_artifact("table1", rl_run_markers("table1") + [f"{RUNS}/table1/summary/summary.json"], [f"{FIGS}/table1.md"])

    rule table1:
        input:
            f"{FIGS}/table1.md",

else:

    rule table1:
        # a profile without table1 rows: say so instead of planning an empty experiment
        shell:
            "echo 'profile {PROFILE_NAME} has no table1 rows (experiments/profiles/{PROFILE_NAME}.yaml)' >&2; exit 1"
