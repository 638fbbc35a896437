# fig4: the co-training rows of this profile (experiments/profiles/<profile>.yaml, section fig4:), their
# summary (repro.rl.summary) and the figure with the paper's values beside ours (repro.report.artifacts.fig4).
if "RL_RULES_INCLUDED" not in globals():

    include: "rl.smk"


if rl_rows("fig4"):

    register_artifact("fig4", rl_run_markers("fig4") + [f"{RUNS}/fig4/summary/summary.json"], [f"{FIGS}/fig4.md"])

    rule fig4:
        input:
            f"{FIGS}/fig4.md",

else:

    rule fig4:
        # a profile without fig4 rows: say so instead of planning an empty experiment
        shell:
            "echo 'profile {PROFILE_NAME} has no fig4 rows (experiments/profiles/{PROFILE_NAME}.yaml)' >&2; exit 1"
