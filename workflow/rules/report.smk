# Collection, reports and comparison: they read run folders and collected data only, never re-run anything.


rule collect_artifact:
    # one artifact's runs of this profile: this machine's and the reference machines' (results/reference/)
    localrule: True
    input:
        lambda wc: of(f"{TIDY}/{{artifact}}.csv")(wc).inputs,
    output:
        f"{TIDY}/{{artifact}}.csv",
    wildcard_constraints:
        artifact="|".join(ARTIFACTS),
    run:
        run_job(output[0])


rule report:
    localrule: True
    input:
        lambda wc: of(f"{FIGS}/{{artifact}}.md")(wc).inputs,
    output:
        f"{FIGS}/{{artifact}}.md",
    wildcard_constraints:
        artifact="|".join(ARTIFACTS),
    run:
        run_job(output[0])
        shell("cat {output}")


COLLECT = f"{PLAN.python} -m repro.report.collect --results results --out results/tidy --here {RUNS}"
COMPARE = (f"{PLAN.python} -m repro.report.compare --profile {PROFILE.name} --tidy results/tidy/metrics.csv "
           f"--env {PLAN.envcheck} --machine {MACHINE} --out {FIGS}/comparison")


rule collect:
    # every run folder under results/ as one tidy table, over what exists now (it never starts a run; `all` collects
    # after its artifacts). A bad run folder is named, skipped, and fails the rule after everything else is written.
    localrule: True
    input:
        [o for a in PLAN.artifacts() for o in PLAN.targets(a) if Path(o).exists()],
    output:
        metrics="results/tidy/metrics.csv",
        runs="results/tidy/runs.csv",
    shell:
        COLLECT


rule compare:
    # measured against the paper, artifact by artifact, opening with how this machine stands
    localrule: True
    input:
        tidy="results/tidy/metrics.csv",
        env=PLAN.envcheck,
    output:
        index=f"{FIGS}/comparison/index.md",
    shell:
        COMPARE + " && cat {output.index}"


rule publish:
    # this machine's finished runs of the profile as reference data (results/reference/<machine>/<label>/), which
    # later clones draw beside their own measurements; not part of `all` (run the artifacts you want first)
    localrule: True
    shell:
        "{PLAN.python} -m repro.report.publish --runs {RUNS} --out results/reference/{MACHINE}/{PLAN.label}"
