# all: every artifact whose experiment exists, then one collection and comparison over everything.


rule all:
    default_target: True
    input:
        ENV_JSON,
        [f for outs in ARTIFACT_REPORTS.values() for f in outs],
    # No output: runs whenever it is asked for, after every artifact, so the comparison covers them.
    shell:
        "{COLLECT_CMD} && {COMPARE_CMD}"
