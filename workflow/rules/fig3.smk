# fig3: the co-training rows of this profile (experiments/profiles/<profile>.yaml, section fig3:), their
# summary (repro.rl.summary) and the figure with the paper's values beside ours (repro.report.artifacts.fig3).
if "RL_RULES_INCLUDED" not in globals():

    include: "rl.smk"


if rl_rows("fig3"):

    register_artifact("fig3", rl_run_markers("fig3") + [f"{RUNS}/fig3/summary/summary.json"], [f"{FIGS}/fig3.md"])

    rule fig3:
        input:
            f"{FIGS}/fig3.md",

else:

    rule fig3:
        # a profile without fig3 rows: say so instead of planning an empty experiment
        shell:
            "echo 'profile {PROFILE_NAME} has no fig3 rows (experiments/profiles/{PROFILE_NAME}.yaml)' >&2; exit 1"
