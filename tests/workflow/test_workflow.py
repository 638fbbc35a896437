"""The Snakemake workflow plans through repro.plan: every target plans (dry run) for every profile; bad --config
values, unknown targets and unservable profiles fail before any job runs, naming what is wrong; a machine without
its own results plans real jobs; GPU jobs ask the scheduler for their GPUs.

    .venv/bin/python -m pytest -q tests/workflow/test_workflow.py
"""
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from repro.core.profile import available_profiles, load_profile, load_profile_model
from repro.core.provenance import hardware
from repro.plan import ARTIFACTS, Plan

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def snakemake(*args, cwd=ROOT):
    return subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=170)


@functools.lru_cache(maxsize=1)
def target_rules():
    out = snakemake("--list-target-rules")
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_every_artifact_has_a_target():
    assert {"envcheck", "collect", "compare", "all", "publish", *ARTIFACTS} <= target_rules()


@pytest.mark.parametrize("profile", available_profiles())
def test_every_target_plans_for_every_profile(profile):
    plan = Plan(load_profile_model(profile), {}, machine="m")
    targets = ["envcheck", "all", *plan.artifacts()]
    out = snakemake("-n", *targets, "--config", f"profile={profile}", "machine=plan-test")
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_fresh_machine_plans_real_jobs():
    """A machine's results live in results/<its tag>/ (git-ignored): a clone, or another machine, finds none of
    them and measures, whatever results/reference/ holds."""
    out = snakemake("-n", "table1", "--config", "machine=another-box")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    # cpu-tiny's table1 trains each policy's rows in lockstep: one rl_lockstep job per policy
    assert "rule rl_sft:" in text and "rule rl_lockstep:" in text and "results/another-box/cpu-tiny/table1/" in text
    assert re.search(r"cpu-\d+c-[a-z0-9-]+", hardware()["tag"]), "the detected tag names cores and CPU model"


@pytest.mark.parametrize("config,message", [
    ("profile=a100", r"unknown profile 'a100'; expected one of .*cpu-tiny"),
    ("seed=-3", r"-3 is less than the minimum of 0"),
    ("bogus=1", r"Additional properties are not allowed \('bogus' was unexpected\)"),
    ("engine=foo", r"'foo' is not one of \['suite', 'nemo-rl'\]"),
])
def test_bad_config_fails_before_planning(config, message):
    out = snakemake("-n", "all", "--config", config)
    assert out.returncode != 0
    assert re.search(message, out.stdout + out.stderr), out.stdout + out.stderr
    assert "Building DAG" not in out.stdout + out.stderr


def test_unknown_target_is_named():
    out = snakemake("-n", "table9")
    assert out.returncode != 0 and "table9" in out.stdout + out.stderr


def test_a_target_the_profile_lacks_says_so(workdir):
    out = workdir.run("fig5")
    assert out.returncode != 0 and "profile tiny-test has no fig5: section" in out.stdout + out.stderr


@pytest.mark.skipif(hardware()["gpus"]["count"] > 0, reason="checks the refusal on a CPU-only machine")
def test_unservable_profile_fails_before_any_job(workdir):
    out = snakemake("-c1", "envcheck", "--config", "profile=h200", "machine=test-machine", cwd=workdir.path)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "profile 'h200' cannot run on this machine" in text and "GPU" in text
    assert not (workdir.path / "results" / "test-machine" / "h200" / "envcheck" / "bench.json").exists()


@pytest.mark.skipif(hardware()["gpus"]["count"] > 0, reason="checks a CPU-only machine")
def test_a_gpu_profiles_runs_publish_from_a_machine_without_its_hardware(workdir):
    """Only the rules that measure need the profile's hardware: publishing a GPU profile's finished runs, copied
    here from the GPU machine, runs on this CPU machine."""
    run = workdir.path / "results" / "test-machine" / "h200" / "table1" / "qwen3-8b_no_draft"
    run.mkdir(parents=True)
    (run / "env.json").write_text('{"finished": true, "git": {"sha": "' + "a" * 40 + '"}}')
    out = subprocess.run([*SNAKEMAKE, "-c1", "publish", "--config", "profile=h200", "machine=test-machine"],
                         cwd=workdir.path, env=workdir.env, capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert (workdir.path / "results" / "reference" / "test-machine" / "h200" / "table1" / "qwen3-8b_no_draft"
            / "env.json").is_file()


def test_every_rule_that_runs_a_job_but_the_summary_checks_the_hardware():
    """The hardware check is skipped for workflows that run no MEASURING_RULES: a new job rule must join them."""
    common = (ROOT / "workflow" / "rules" / "common.smk").read_text()
    measuring = set(re.findall(r'"(\w+)"', re.search(r"MEASURING_RULES = \{(.*?)\}", common).group(1)))
    job_rules = set(re.findall(r"^rule (\w+):", (ROOT / "workflow" / "rules" / "jobs.smk").read_text(), re.M))
    assert measuring == job_rules - {"rl_summary"}


@pytest.mark.parametrize("artifact", ["fig3", "fig4"])
def test_baseline_seed_replicas_are_planned_with_their_seeds(artifact):
    # cpu-tiny asks for baseline_seeds [1, 2]: the no-draft row runs again into no_draft_sampling<k>, with the main
    # run's seed (its prompts) and sampling seed k
    cmds = [j.cmd for j in Plan(load_profile_model("cpu-tiny"), {}, machine="m").jobs.values()
            if j.kind == "rl" and j.artifact == artifact]
    for k in (1, 2):
        assert any(re.search(rf"--row 'no draft' .*--out \S+/{artifact}/no_draft_sampling{k} --seed 0 "
                             rf"--sampling-seed {k} ", c) for c in cmds), cmds
    assert any(re.search(rf"--row 'no draft' .*--out \S+/{artifact}/no_draft --seed 0 --threads", c) for c in cmds)
    assert not any(re.search(r"--row DSpark .*--sampling-seed", c) for c in cmds)


def test_lockstep_sections_plan_one_job_per_policy():
    # h200's table1 says lockstep: true: one repro.rl.lockstep job per policy instead of one rl_run per row
    jobs = [j for j in Plan(load_profile_model("h200"), {}, machine="m").jobs.values() if j.artifact == "table1"]
    lock = [j.cmd for j in jobs if j.kind == "lockstep"]
    assert len(lock) == 2 and not [j for j in jobs if j.kind == "rl"]
    assert any(re.search(r"--rows 'Qwen3-8B/no draft,Qwen3-8B/EAGLE-3,Qwen3-8B/DFlash,Qwen3-8B/DSpark' "
                         r".*--record \S+/table1/lockstep_dense\.json", c) for c in lock), lock


def test_lockstep_sections_train_the_baseline_seed_replicas_in_their_process():
    # h200's fig3 runs in lockstep and asks for baseline_seeds [1, 2, 3, 4]: the replicas train in one more lockstep
    # job (one process's compilations) instead of a process each
    jobs = [j for j in Plan(load_profile_model("h200"), {}, machine="m").jobs.values() if j.artifact == "fig3"]
    lock = sorted(j.cmd for j in jobs if j.kind == "lockstep")
    assert len(lock) == 2 and not [j for j in jobs if j.kind == "rl"], [j.cmd for j in jobs]
    assert re.search(r"--rows 'no draft,EAGLE-3,DFlash,DSpark' .*--record \S+/fig3/lockstep_dense\.json", lock[0])
    assert re.search(r"--rows 'no draft@1,no draft@2,no draft@3,no draft@4' .*--warm-start \S+/sft/dense-math "
                     r".*--record \S+/fig3/lockstep_dense_seeds\.json", lock[1]), lock


def test_a_profile_edit_reruns_only_the_jobs_that_read_it():
    base = Plan(load_profile_model("cpu-tiny"), {}, machine="m")
    prof = load_profile("cpu-tiny")
    prof["rl"]["drafts"]["dflash"]["lr"] = 5.0e-4
    from repro.core.profile import parse_profile
    edited = Plan(parse_profile(prof, "edited"), {}, machine="m")
    changed = {o for o, j in base.jobs.items() if j.settings != edited.jobs[o].settings}
    # table1's lockstep jobs train a DFlash row beside the others of their policy, so they read the edit too
    assert changed and all("dflash" in o or "/sft/" in o or "/table1/lockstep_" in o for o in changed), sorted(changed)
    assert not any("qwen3-8b_no_draft" in o or "eagle-3" in o or "fig7" in o for o in changed)


def test_longer_math_problems_retrain_the_math_warm_starts_only():
    base = Plan(load_profile_model("cpu-tiny"), {}, machine="m")
    prof = load_profile("cpu-tiny")
    prof["rl"]["workload"]["math_ops"] = [6, 9]
    from repro.core.profile import parse_profile
    edited = Plan(parse_profile(prof, "edited"), {}, machine="m")
    sft = {o: j.settings != edited.jobs[o].settings for o, j in base.jobs.items() if j.kind == "sft"}
    assert sft and all(changed == ("-math/" in o) for o, changed in sft.items()), sft
    same = Plan(parse_profile(load_profile("cpu-tiny"), "again"), {}, machine="m")
    assert all(j.settings == same.jobs[o].settings for o, j in base.jobs.items())


def test_gpu_jobs_ask_the_slurm_scheduler_for_their_gpus():
    """A dry run with the SLURM executor shows every GPU job's request: the paper rows 8 GPUs on one node, the
    one-GPU profile one GPU per job."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    for profile, want in (("paper-h100", "gpu=8, nodes=1"), ("h200", "gpu=1")):
        out = snakemake("-n", "--profile", "workflow/profiles/slurm", "all", "--config", f"profile={profile}",
                        "machine=cluster-test")
        text = out.stdout + out.stderr
        assert out.returncode == 0, text
        blocks = re.findall(r"^rule (\w+):\n((?:    .*\n)+)", text, re.M)
        gpu_rules = {"rl_run", "rl_lockstep", "rl_sft", "bench_run", "attention_check", "envcheck_run"}
        runs = [(name, body) for name, body in blocks if name in gpu_rules]
        assert runs, text
        for name, body in runs:
            assert re.search(r"resources: .*gpu=[1-9]", body), f"{profile}: {name} asks for no GPU:\n{body}"
        assert any(want in body for name, body in runs if name == "rl_run" or name == "rl_lockstep"), text


def test_multinode_rows_run_srun_torchrun_and_nemo_rl_rows_submit_from_local_rules(tmp_path):
    prof = load_profile("paper-gb200")
    for spec in prof["rl"]["policies"].values():
        spec["mesh"] = {"pp": 8, "cp": 1}                  # two 4-GPU nodes
    plan = Plan(load_profile_model_from(prof, tmp_path), {"engine": "suite", "checkpoint_root": "/ckpt"},
                machine="cluster-test")
    cmds = [j for j in plan.jobs.values() if j.kind == "rl" and j.artifact == "table1"]
    assert cmds and all(j.nodes == 2 and j.gpus == 8 for j in cmds)
    assert all(j.cmd.startswith("srun --nodes=2 --ntasks-per-node=1 ") and "--nnodes=2 --nproc-per-node=4" in j.cmd
               and "--rdzv-backend=c10d" in j.cmd and "--standalone" not in j.cmd for j in cmds)
    nemo = Plan(load_profile_model("paper-gb200"), {}, machine="cluster-test")
    multi = [j for j in nemo.jobs.values() if j.kind == "rl" and j.nodes > 1]
    assert multi and all(j.local for j in multi)
    assert set(nemo.local_runs()) == {j.outputs[0].rsplit("/", 2)[-2] for j in multi}


def load_profile_model_from(prof: dict, tmp_path: Path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof))
    return load_profile_model(str(path))
