# collect: W&B logs of run folders -> tidy tables; compare: measured vs paper per artifact.


rule collect:
    input:
        ENV_JSON,
        existing_runs(),
    output:
        metrics=f"{TIDY}/metrics.csv",
        runs=f"{TIDY}/runs.csv",
    log:
        f"{TIDY}/collect.log",
    shell:
        "{COLLECT_CMD} > {log} 2>&1"


rule collect_artifact:
    # One artifact's runs (every hardware it was measured on, this profile; with an engine other than the
    # profile's, this machine's <profile>-<engine> folders only); orders reports after runs.
    input:
        lambda wc: ARTIFACT_RUNS[wc.artifact],
    output:
        f"{TIDY}/{LABEL}/{{artifact}}.csv",
    wildcard_constraints:
        artifact="|".join(PAPER_ARTIFACTS),
    shell:
        "{PY} -m repro.report.collect --results {COLLECT_ROOT} --artifact {wildcards.artifact} "
        "--profile {PROFILE_NAME} --tidy-file {output}"


rule compare:
    input:
        tidy=f"{TIDY}/metrics.csv",
        env=ENV_JSON,
    output:
        index=f"{FIGS}/comparison/index.md",
        reports=expand(f"{FIGS}/comparison/{{artifact}}.md", artifact=PAPER_ARTIFACTS),
    shell:
        "{COMPARE_CMD}"
