# Helpers shared by every rule file: config and profile validation, the hardware check, paths,
# and the registry of artifacts. No rules here.
import sys

from snakemake.exceptions import WorkflowError

from repro.report.paper import ARTIFACTS as PAPER_ARTIFACTS
from repro.report.profiles import ProfileError, check_servable, load_profile, validate
from repro.report.provenance import hardware

# A bad --config value fails here, before the DAG is built, naming the key and the allowed values.
try:
    validate(config, "config.schema.yaml", "--config / workflow/config.yaml")
    PROFILE = load_profile(config["profile"])
except ProfileError as exc:
    raise WorkflowError(str(exc))

PROFILE_NAME = PROFILE["name"]
# Run folders are named after the detected machine when jobs run here. Under a cluster executor the
# Snakefile is parsed on the login node and again inside each job on a compute node, so the folder
# name must not depend on either machine; env.json inside records the hardware that ran the job.
HW = (hardware()["tag"] if workflow.local_exec and not workflow.remote_exec
      else f"cluster-{PROFILE_NAME}")
# The interpreter Snakemake runs under is the suite's environment.
PY = sys.executable
RUNS = f"results/{HW}/{PROFILE_NAME}"
FIGS = f"paper_figures/{PROFILE_NAME}"
TIDY = "results/tidy"
ENV_JSON = f"{RUNS}/envcheck/env.json"

# artifact -> files its run rule writes / files its report rule writes (filled by workflow/rules/<artifact>.smk)
ARTIFACT_RUNS = {}
ARTIFACT_REPORTS = {}


def register_artifact(name, runs, reports):
    """Declare an artifact's run outputs and report outputs (called once per rules/<artifact>.smk)."""
    if name not in PAPER_ARTIFACTS:
        raise WorkflowError(f"unknown artifact {name!r}; expected one of {PAPER_ARTIFACTS}")
    ARTIFACT_RUNS[name] = list(runs)
    ARTIFACT_REPORTS[name] = list(reports)


def existing_runs():
    """Run outputs already on disk (collect/compare report on what exists; they never force a run)."""
    return [f for outs in ARTIFACT_RUNS.values() for f in outs if Path(f).exists()]


def report_cmd(artifact):
    """Shell command building an artifact's tables/figures from its collected data."""
    return (f"{PY} -m repro.report.build --artifact {artifact} --profile {PROFILE_NAME} "
            f"--tidy {TIDY}/{PROFILE_NAME}/{artifact}.csv --out {FIGS}")


COLLECT_CMD = f"{PY} -m repro.report.collect --results results --out {TIDY}"
COMPARE_CMD = (f"{PY} -m repro.report.compare --profile {PROFILE_NAME} --tidy {TIDY}/metrics.csv "
               f"--env {ENV_JSON} --out {FIGS}/comparison")


onstart:
    # The profile's hardware and local paths are checked before any job runs (dry runs plan freely).
    # Under a cluster executor (SLURM) jobs run on compute nodes: only local paths are checked here.
    try:
        check_servable(PROFILE, config, jobs_run_here=workflow.local_exec)
    except ProfileError as exc:
        raise WorkflowError(str(exc))
