# envcheck: the machine (detected) and its measured ceilings. Also the pattern an artifact follows:
# a run rule writing a run folder through the suite's logger, then collection and reports.


rule envcheck:
    output:
        env=ENV_JSON,
        bench=f"{RUNS}/envcheck/bench.json",
    log:
        f"{RUNS}/envcheck/log.txt",
    shell:
        "{PY} -m repro.bench.envcheck --profile {PROFILE_NAME} --out {RUNS}/envcheck > {log} 2>&1"
