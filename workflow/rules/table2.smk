# table2: the co-training rows of this profile (experiments/profiles/<profile>.yaml, section table2:), their
# summary (repro.rl.summary) and the table with the paper's values beside ours (repro.report.artifacts.table2).
if "RL_RULES_INCLUDED" not in globals():

    include: "rl.smk"


if rl_rows("table2"):

    register_artifact("table2", rl_run_markers("table2") + [f"{RUNS}/table2/summary/summary.json"], [f"{FIGS}/table2.md"])

    rule table2:
        input:
            f"{FIGS}/table2.md",

else:

    rule table2:
        # a profile without table2 rows: say so instead of planning an empty experiment
        shell:
            "echo 'profile {PROFILE_NAME} has no table2 rows (experiments/profiles/{PROFILE_NAME}.yaml)' >&2; exit 1"
