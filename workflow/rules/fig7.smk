# fig7: PP fan-in of target features into the draft's stage, TapChannel vs host staging
# (repro.bench.fig7; settings in the profile's fig7: section, experiments/profiles/<profile>.yaml),
# then the figure and table with the paper's values beside ours (repro.report.artifacts.fig7).
# On h200 the run comes from the one-GPU session (repro/bench/gpu_tapchannel.py), copied into results/.


register_artifact("fig7", [f"{RUNS}/fig7/bench.json"], [f"{FIGS}/fig7.md"])


rule fig7_run:
    output:
        bench=f"{RUNS}/fig7/bench.json",
    log:
        f"{RUNS}/fig7/log.txt",
    shell:
        "{PY} -m repro.bench.fig7 --profile {PROFILE_NAME} --out {RUNS}/fig7 > {log} 2>&1"


rule fig7_report:
    input:
        unpack(lambda wc: report_input("fig7")),
    output:
        f"{FIGS}/fig7.md",
        f"{FIGS}/fig7.csv",
        f"{FIGS}/fig7.pdf",
        f"{FIGS}/fig7.png",
    params:
        cmd=report_cmd("fig7"),
    shell:
        "{params.cmd}"


rule fig7:
    input:
        f"{FIGS}/fig7.md",
