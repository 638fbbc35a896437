# fig4: the co-training rows of this profile (experiments/profiles/<profile>.yaml, section fig4:), their
# summary (repro.rl.summary) and the figure with the paper's values beside ours (repro.report.artifacts.fig4).
if "RL_RULES_INCLUDED" not in globals():

    include: "rl.smk"


register_artifact("fig4", rl_run_markers("fig4") + [f"{RUNS}/fig4/summary/summary.json"], [f"{FIGS}/fig4.md"])


rule fig4:
    input:
        f"{FIGS}/fig4.md",
