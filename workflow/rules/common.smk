# The profile, the plan and the lookups the rules share. The planner (repro/plan.py) decides every job; the rule
# files only match files to its jobs. No rules here.
import fcntl
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from repro.core.profile import ProfileError, check_servable, load_profile, load_profile_model
from repro.core.provenance import hardware
from repro.plan import ARTIFACTS, BENCH_ARTIFACTS, RL_ARTIFACTS, Plan

# A bad --config value or profile fails here, before the DAG is built, naming the file, key and value.
try:
    PROFILE = load_profile_model(str(config["profile"]))
    # Jobs run here: this machine's tag names the results. Under a cluster executor the Snakefile is parsed on
    # the login node and again inside each job, so the tag must not depend on either machine.
    MACHINE = config.get("machine") or (hardware()["tag"] if workflow.local_exec and not workflow.remote_exec
                                        else f"cluster-{PROFILE.name}")
    PLAN = Plan(PROFILE, config, machine=MACHINE, python=sys.executable, profile_arg=str(config["profile"]))
except ProfileError as exc:
    raise WorkflowError(str(exc))

RUNS, FIGS, TIDY = PLAN.runs, PLAN.figs, PLAN.tidy


def job(path):
    """The planned job writing ``path`` (a WorkflowError naming the file otherwise)."""
    try:
        return PLAN.job(path)
    except ProfileError as exc:
        raise WorkflowError(str(exc))


def of(pattern):
    """The planned job of a rule's output pattern, looked up from a job's wildcards."""
    return lambda wc: job(pattern.format(**wc))


def run_job(path):
    """Run the planned job writing ``path``. Its command is not a rule parameter, so a change to how it is launched
    (the interpreter's path, the log) does not redo a measurement; its settings digest is, so a change to what it
    reads from the profile does."""
    shell(job(path).shell.replace("{", "{{").replace("}", "}}"))


def hold_checkout_lock():
    """One workflow at a time per checkout, held by the OS: released even on SIGKILL, so a rerun after a kill
    starts without `--unlock` (Snakemake's own lock, which a kill leaves behind, is off in profiles/default)."""
    global _LOCK
    os.makedirs(".snakemake", exist_ok=True)
    _LOCK = open(".snakemake/repro.lock", "a+")
    try:
        fcntl.flock(_LOCK, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise WorkflowError("another snakemake runs in this checkout (.snakemake/repro.lock is held); wait for it "
                            "or stop it, then rerun the same command")


# the rules that measure (or train): only a workflow that runs one of them needs the profile's hardware; the others
# read finished runs (collect, tables, compare, publish), so a GPU profile's runs publish from any machine
MEASURING_RULES = {"envcheck_run", "attention_check", "bench_run", "rl_sft", "rl_run", "rl_submit", "rl_lockstep"}


onstart:
    # Runs only when jobs are about to run (never in dry runs). The profile's hardware and local paths are checked
    # first; under a cluster executor (SLURM) jobs run on compute nodes, so only local paths are checked here.
    hold_checkout_lock()
    if not any(j.rule.name in MEASURING_RULES for j in workflow.dag.needrun_jobs()):
        return
    try:
        needs = load_profile(str(config["profile"]))
        if PLAN.engine == "suite":
            needs["checkpoints"] = {k: PROFILE.checkpoints[k] for k in PLAN.suite_checkpoints()}
            needs["engine"] = "suite"
        check_servable(needs, config, jobs_run_here=workflow.local_exec)
    except ProfileError as exc:
        raise WorkflowError(str(exc))
