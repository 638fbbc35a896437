# fig6: TTT and block-draft attention at fixed global lengths across CP sizes (repro.bench.fig6; settings
# per profile in repro.bench.fig6.DEFAULTS), then the figure and table with the paper's values beside ours
# (repro.report.artifacts.fig6). On h200 the CP=1 run comes from the one-GPU session
# (repro/bench/gpu_attention.py), copied into results/<gpu hw>/h200/fig6/; CP > 1 needs one GPU per rank.


register_artifact("fig6", [f"{RUNS}/fig6/bench.json"], [f"{FIGS}/fig6.md"])


rule fig6_run:
    output:
        bench=f"{RUNS}/fig6/bench.json",
    log:
        f"{RUNS}/fig6/log.txt",
    shell:
        "{PY} -m repro.bench.fig6 --profile {PROFILE_NAME} --out {RUNS}/fig6 > {log} 2>&1"


rule fig6_report:
    input:
        unpack(lambda wc: report_input("fig6")),
    output:
        f"{FIGS}/fig6.md",
        f"{FIGS}/fig6.csv",
        f"{FIGS}/fig6.pdf",
        f"{FIGS}/fig6.png",
    params:
        cmd=report_cmd("fig6"),
    shell:
        "{params.cmd}"


rule fig6:
    input:
        f"{FIGS}/fig6.md",
