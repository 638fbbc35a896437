# Helpers shared by every rule file: config and profile validation, the hardware check, paths,
# and the registry of artifacts. No rules here.
import sys

from snakemake.exceptions import WorkflowError

from repro.report.paper import ARTIFACTS as PAPER_ARTIFACTS
from repro.core.profile import ProfileError, check_servable, load_profile, validate
from repro.core.provenance import hardware

# A bad --config value fails here, before the DAG is built, naming the key and the allowed values.
try:
    validate(config, "config.schema.yaml", "--config / workflow/config.yaml")
    PROFILE = load_profile(config["profile"])
except ProfileError as exc:
    raise WorkflowError(str(exc))

PROFILE_NAME = PROFILE["name"]
# The engine of the end-to-end rows (rl.smk): the profile's own unless --config engine= names the other.
# Outputs of the other engine are kept apart from the profile's own: run folders, per-artifact tidy tables
# and reports are labelled <profile>-<engine> (the runs still read experiments/profiles/<profile>.yaml).
ENGINE = config.get("engine") or PROFILE["engine"]
LABEL = PROFILE_NAME if ENGINE == PROFILE["engine"] else f"{PROFILE_NAME}-{ENGINE}"


def suite_checkpoints(profile):
    """Keys of checkpoints: that the profile's rl: section loads (policies and drafts with a checkpoint)."""
    rl = profile.get("rl") or {}
    return sorted({entry["checkpoint"] for section in ("policies", "drafts")
                   for entry in (rl.get(section) or {}).values()
                   if isinstance(entry, dict) and entry.get("checkpoint")})


# Engine choices that cannot work fail here, before the DAG is built (dry runs too), naming the flag.
if ENGINE == "nemo-rl" and not PROFILE.get("nemo_rl"):
    raise WorkflowError(f"--config engine=nemo-rl is invalid for profile {PROFILE_NAME!r}: it has no nemo_rl: "
                        f"section (experiments/profiles/{PROFILE_NAME}.yaml); expected engine=suite")
if ENGINE == "suite" and not PROFILE.get("rl"):
    raise WorkflowError(f"--config engine=suite is invalid for profile {PROFILE_NAME!r}: it has no rl: section "
                        f"(experiments/profiles/{PROFILE_NAME}.yaml); expected engine=nemo-rl")
if ENGINE == "suite" and suite_checkpoints(PROFILE) and not config.get("checkpoint_root"):
    raise WorkflowError(
        f"--config engine=suite on profile {PROFILE_NAME!r} loads the checkpoints "
        f"{', '.join(suite_checkpoints(PROFILE))} (its rl: section) but checkpoint_root is not set: add "
        f"--config checkpoint_root=/path, the folder holding "
        f"{', '.join(PROFILE['checkpoints'][k] for k in suite_checkpoints(PROFILE))}")
# Run folders are named after the detected machine when jobs run here. Under a cluster executor the
# Snakefile is parsed on the login node and again inside each job on a compute node, so the folder
# name must not depend on either machine; env.json inside records the hardware that ran the job.
HW = (hardware()["tag"] if workflow.local_exec and not workflow.remote_exec
      else f"cluster-{PROFILE_NAME}")
# The interpreter Snakemake runs under is the suite's environment.
PY = sys.executable
RUNS = f"results/{HW}/{LABEL}"
FIGS = f"paper_figures/{LABEL}"
TIDY = "results/tidy"
# Where an artifact's tidy table is collected from: every machine's runs of the profile, or only this
# label's run folders when the engine is not the profile's own (the collector cannot tell engines apart).
COLLECT_ROOT = "results" if LABEL == PROFILE_NAME else RUNS
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


def report_input(artifact):
    """A report rule's inputs: the artifact's tidy table and its runs. The runs too, so that a report older than
    its runs is redone even when the tidy file in between is missing (snakemake does not remake a missing
    intermediate file for an output it otherwise finds up to date, e.g. after a failed collect)."""
    return {"tidy": f"{TIDY}/{LABEL}/{artifact}.csv", "runs": ARTIFACT_RUNS[artifact]}


def report_cmd(artifact):
    """Shell command building an artifact's tables/figures from its collected data."""
    return (f"{PY} -m repro.report.build --artifact {artifact} --profile {PROFILE_NAME} "
            f"--tidy {TIDY}/{LABEL}/{artifact}.csv --out {FIGS}")


COLLECT_CMD = f"{PY} -m repro.report.collect --results results --out {TIDY}"
COMPARE_CMD = (f"{PY} -m repro.report.compare --profile {PROFILE_NAME} --tidy {TIDY}/metrics.csv "
               f"--env {ENV_JSON} --out {FIGS}/comparison")


onstart:
    # The profile's hardware and local paths are checked before any job runs (dry runs plan freely).
    # Under a cluster executor (SLURM) jobs run on compute nodes: only local paths are checked here.
    try:
        # on the suite engine only the checkpoints its rl: section loads are needed (not NeMo-RL's drafts)
        needs = dict(PROFILE, engine=ENGINE)
        if ENGINE == "suite":
            needs["checkpoints"] = {k: PROFILE["checkpoints"][k] for k in suite_checkpoints(PROFILE)}
        check_servable(needs, config, jobs_run_here=workflow.local_exec)
    except ProfileError as exc:
        raise WorkflowError(str(exc))
