# fig5: packed zigzag CP vs the best USP split (SpecForge), EAGLE-3 TTT with 3 passes
# (repro.bench.fig5; settings per profile in repro.bench.fig5.DEFAULTS), then the figure and table with
# the paper's values beside ours (repro.report.artifacts.fig5). Needs C processes: gloo on CPU
# (cpu-tiny, cpu-emulated), one GPU per rank on GPU profiles (h200 with one GPU stops with a clear error).


register_artifact("fig5", [f"{RUNS}/fig5/bench.json"], [f"{FIGS}/fig5.md"])


rule fig5_run:
    output:
        bench=f"{RUNS}/fig5/bench.json",
    log:
        f"{RUNS}/fig5/log.txt",
    shell:
        "{PY} -m repro.bench.fig5 --profile {PROFILE_NAME} --out {RUNS}/fig5 > {log} 2>&1"


rule fig5_report:
    input:
        unpack(lambda wc: report_input("fig5")),
    output:
        f"{FIGS}/fig5.md",
        f"{FIGS}/fig5.csv",
        f"{FIGS}/fig5.pdf",
        f"{FIGS}/fig5.png",
    params:
        cmd=report_cmd("fig5"),
    shell:
        "{params.cmd}"


rule fig5:
    input:
        f"{FIGS}/fig5.md",
