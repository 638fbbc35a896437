# One target per artifact: every file of it (runs, summary, collected table, report), so a file that is missing
# (a killed job, a deleted run) is remade, not skipped. A profile without the artifact's section says so.


localrules:
    envcheck,
    all,


def target(artifact):
    return PLAN.targets(artifact) if not PLAN.missing(artifact) else []


def refusal(artifact):
    return f"echo '{PLAN.missing(artifact)}' >&2; exit 1" if PLAN.missing(artifact) else "true"


rule envcheck:
    input:
        PLAN.envcheck,


for _artifact in ARTIFACTS:

    rule:
        name:
            _artifact
        localrule: True
        input:
            target(_artifact),
        params:
            refusal=refusal(_artifact),
        shell:
            "{params.refusal}"


rule all:
    # every artifact of the profile, then one collection and comparison over everything (no output: it runs after
    # the artifacts every time it is asked for)
    default_target: True
    input:
        [o for a in PLAN.artifacts() for o in PLAN.targets(a)],
        PLAN.envcheck,
    shell:
        f"{COLLECT} && {COMPARE} && cat {FIGS}/comparison/index.md"
