"""The Snakemake workflow: every existing target plans (dry run) for every profile; bad --config
values, unknown targets and unservable profiles fail before any job runs, naming what is wrong.

    .venv/bin/python -m pytest -q tests/workflow
"""
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from repro.core.profile import available_profiles
from repro.core.provenance import hardware
from repro.report.paper import ARTIFACTS

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--nolock"]


def snakemake(*args):
    return subprocess.run([*SNAKEMAKE, *args], cwd=ROOT, capture_output=True, text=True, timeout=170)


@functools.lru_cache(maxsize=1)
def target_rules():
    out = snakemake("--list-target-rules")
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_targets_exist_only_with_their_experiments():
    targets = target_rules()
    assert {"envcheck", "collect", "compare", "all"} <= targets
    for artifact in ARTIFACTS:
        has_rules = (ROOT / "workflow" / "rules" / f"{artifact}.smk").is_file()
        assert (artifact in targets) == has_rules, f"target {artifact} exists without its experiment, or vice versa"


@pytest.mark.parametrize("profile", available_profiles())
def test_every_target_plans_for_every_profile(profile):
    targets = sorted(target_rules())
    out = snakemake("-n", *targets, "--config", f"profile={profile}")
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("config,message", [
    ("profile=a100", r"profile.*'a100' is not one of"),
    ("seed=-3", r"seed.*-3 is less than the minimum of 0"),
    ("bogus=1", r"Additional properties are not allowed \('bogus' was unexpected\)"),
])
def test_bad_config_fails_before_planning(config, message):
    out = snakemake("-n", "all", "--config", config)
    assert out.returncode != 0
    assert re.search(message, out.stdout + out.stderr), out.stdout + out.stderr


def test_unknown_target_is_named():
    out = snakemake("-n", "table9")
    assert out.returncode != 0 and "table9" in out.stdout + out.stderr


@pytest.mark.skipif(hardware()["gpus"]["count"] > 0, reason="checks the refusal on a CPU-only machine")
def test_unservable_profile_fails_before_any_job(tmp_path):
    out = snakemake("-c1", "envcheck", "--config", "profile=h200")
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "profile 'h200' cannot run on this machine" in text and "GPU" in text
    assert not (ROOT / "results" / hardware()["tag"] / "h200" / "envcheck" / "env.json").exists()


@pytest.mark.parametrize("artifact", ["fig3", "fig4"])
def test_baseline_seed_replicas_are_planned_with_their_seeds(artifact):
    # cpu-tiny asks for baseline_seeds [1, 2]: the no-draft row runs again into no_draft_sampling<k>, with the main
    # run's seed (its prompts) and sampling seed k
    out = snakemake("-n", "-p", "--forceall", artifact, "--config", "profile=cpu-tiny")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    for k in (1, 2):
        assert f"{artifact}/no_draft_sampling{k}/run.json" in text
        assert re.search(rf"--row 'no draft' .*--out \S+/{artifact}/no_draft_sampling{k} --seed 0 --sampling-seed {k} ",
                         text), text
    assert re.search(rf"--row 'no draft' .*--out \S+/{artifact}/no_draft --seed 0 ", text), text
    assert not re.search(r"--row 'DSpark' .*--seed [12] ", text)
    assert not re.search(r"--row 'DSpark' .*--sampling-seed", text)
    assert not re.search(rf"--out \S+/{artifact}/no_draft --seed 0 --sampling-seed", text)


def test_profile_schema_refuses_bad_baseline_seeds():
    from repro.core.profile import ProfileError, load_profile, validate
    profile = load_profile("cpu-tiny")
    profile["fig3"] = {**profile["fig3"], "baseline_seeds": [1, -2]}
    with pytest.raises(ProfileError, match=r"fig3\.baseline_seeds\.1: -2 is less than the minimum of 0"):
        validate(profile, "profile.schema.yaml", "cpu-tiny")
    profile["fig3"]["baseline_seeds"] = [1, 1]
    with pytest.raises(ProfileError, match=r"fig3\.baseline_seeds: .*non-unique"):
        validate(profile, "profile.schema.yaml", "cpu-tiny")


def test_lockstep_sections_plan_one_job_per_policy():
    # h200's table1 says lockstep: true: one repro.rl.lockstep job per policy instead of one rl_run per row
    out = snakemake("-n", "-p", "--forceall", "table1", "--config", "profile=h200")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert re.search(r"repro\.rl\.lockstep --artifact table1 --rows 'Qwen3-8B/no draft,Qwen3-8B/EAGLE-3,"
                     r"Qwen3-8B/DFlash,Qwen3-8B/DSpark' .*--record \S+/table1/lockstep_dense\.json", text), text
    assert "lockstep_moe.json" in text and "repro.rl.run " not in text
    tiny = snakemake("-n", "-p", "--forceall", "table1", "--config", "profile=cpu-tiny")
    assert tiny.returncode == 0 and "repro.rl.run " in tiny.stdout and "repro.rl.lockstep" not in tiny.stdout


def test_profile_schema_refuses_a_non_boolean_lockstep():
    from repro.core.profile import ProfileError, load_profile, validate
    profile = load_profile("cpu-tiny")
    profile["table2"] = {**profile["table2"], "lockstep": "yes"}
    with pytest.raises(ProfileError, match=r"table2\.lockstep: 'yes' is not of type 'boolean'"):
        validate(profile, "profile.schema.yaml", "cpu-tiny")


