# table2: the co-training rows of this profile (experiments/profiles/<profile>.yaml, section table2:), their
# summary (repro.rl.summary) and the table with the paper's values beside ours (repro.report.artifacts.table2).
if "RL_RULES_INCLUDED" not in globals():

    include: "rl.smk"


register_artifact("table2", rl_run_markers("table2") + [f"{RUNS}/table2/summary/summary.json"], [f"{FIGS}/table2.md"])


rule table2:
    input:
        f"{FIGS}/table2.md",
