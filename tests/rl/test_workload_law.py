"""repro.bench.workload_law on CPU: the rollout engine with each draft draws plain sampling's completions of the
math workload from the cpu-tiny warm start, and a verifier that skips the residual is caught; plus its statistics.

    .venv/bin/python -m pytest -q tests/rl/test_workload_law.py
"""
import json
import math

import pytest
import torch

from repro.bench import workload_law
from repro.rollout.law import two_sample_chi2_pvalue
from tests.rollout.helpers import verify_skipping_the_residual

SFT = {"steps": 100, "draft_steps": 40}     # cpu-tiny's SFT shortened (150 / 60): still solves some problems


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A math SFT warm start of cpu-tiny's dense policy and its three drafts, built once for this module (the
    workflow's own, results/cpu-2c/cpu-tiny/sft/dense-math, is not committed)."""
    import yaml

    from repro.report.profiles import load_profile
    from repro.rl.sft import main as sft_main
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("warm")
    prof = load_profile("cpu-tiny")
    prof["rl"]["sft"] = {**prof["rl"]["sft"], **SFT}
    (root / "p.yaml").write_text(yaml.safe_dump(prof))
    assert sft_main(["--profile", str(root / "p.yaml"), "--policy", "dense", "--workload", "math",
                     "--drafts", "eagle3,dflash,dspark", "--threads", "1", "--out", str(root / "dense-math")]) == 0
    return str(root / "dense-math")


def _run(tmp_path, warm, *extra):
    rc = workload_law.main(["--out", str(tmp_path), "--profile", "cpu-tiny", "--warm-start", warm,
                            "--prompts", "8", "--group", "32", "--calls", "3", "--budget-s", "100000", *extra])
    return rc, json.loads((tmp_path / "workload_law.json").read_text())


@pytest.mark.timeout(300)
def test_every_family_draws_plain_samplings_completions(tmp_path, warm):
    rc, rep = _run(tmp_path, warm)
    assert rc == 0 and rep["passed"] and rep["complete"]
    assert rep["arms"]["none"]["completions"] == rep["arms"]["dspark"]["completions"] == 768
    assert set(rep["families"]) == {"eagle3", "dflash", "dspark"}
    for fam in ("eagle3", "dflash", "dspark"):
        assert rep["arms"][fam]["acceptance_length"] > 1.2          # the warm drafts' proposals are accepted
        assert rep["families"][fam]["token_logprob"]["p"] > 1e-3
    assert rep["arms"]["none"]["acceptance_length"] in (None, 1.0)     # no proposals
    assert 0 < rep["arms"]["none"]["reward"] < 1                    # the warm start solves some, not all
    assert rep["provenance"]["hardware"]


@pytest.mark.timeout(300)
def test_a_verifier_that_skips_the_residual_is_caught(tmp_path, monkeypatch, warm):
    monkeypatch.setattr("repro.rollout.engine.verify", verify_skipping_the_residual)
    rc, rep = _run(tmp_path, warm, "--families", "dflash")
    assert rc == 1 and not rep["passed"]
    # the residual-less sampler favours the draft's tokens, which the policy finds less likely
    assert rep["families"]["dflash"]["token_logprob"]["difference"] < 0
    assert rep["families"]["dflash"]["token_logprob"]["p"] < 1e-6


def test_stratified_difference_finds_a_shift_and_not_noise():
    g = torch.Generator().manual_seed(0)
    strata = torch.arange(4).repeat_interleave(500)
    level = strata.double() * 3                      # large between-stratum spread, removed by stratifying
    a = level + torch.randn(2000, generator=g, dtype=torch.float64)
    b = level + torch.randn(2000, generator=g, dtype=torch.float64)
    same = workload_law.stratified_difference(a, b, strata)
    assert same["p"] > 1e-3 and same["se"] == pytest.approx(math.sqrt(2 / 2000), rel=0.1)
    shifted = workload_law.stratified_difference(a + 0.3, b, strata)
    assert shifted["difference"] == pytest.approx(same["difference"] + 0.3) and shifted["p"] < 1e-6


def test_two_sample_chi2():
    g = torch.Generator().manual_seed(1)
    law = torch.tensor([0.5, 0.3, 0.15, 0.05])
    x = torch.bincount(torch.multinomial(law, 4000, replacement=True, generator=g), minlength=4)
    y = torch.bincount(torch.multinomial(law, 3000, replacement=True, generator=g), minlength=4)
    z = torch.bincount(torch.multinomial(torch.tensor([0.4, 0.3, 0.2, 0.1]), 3000, replacement=True, generator=g),
                       minlength=4)
    assert two_sample_chi2_pvalue(x, y) > 1e-3
    assert two_sample_chi2_pvalue(x, z) < 1e-6
    with pytest.raises(ValueError, match="different cells"):
        two_sample_chi2_pvalue(x, y[:3])


@pytest.mark.timeout(120)
def test_progress_after_every_arm(tmp_path, warm):
    from repro.rl.config import load_run_profile
    seen = []
    rep = workload_law.workload_law(load_run_profile("cpu-tiny"), "fig3", ["eagle3"], warm_start=warm, prompts=2,
                                    group=4, calls=1, budget_s=60, alpha=1e-3, seed=0, workdir=tmp_path,
                                    progress=lambda r: seen.append(json.loads(json.dumps(r))))
    assert [sorted(r["arms"]) for r in seen] == [["none"], ["eagle3", "none"]]
    assert not seen[0]["complete"] and not seen[0]["families"] and "eagle3" in seen[1]["families"]
    assert rep["complete"] and rep["arms"]["eagle3"]["calls"] == rep["arms"]["none"]["calls"] == 1


@pytest.mark.timeout(180)
def test_from_run_starts_every_arm_from_the_runs_checkpoint(tmp_path, warm):
    from repro.rl.config import load_run_profile, run_config_from_profile
    from repro.rl.hf_tokenizer import tokenizer_for_run
    from repro.rl.trainer import CoTrainer
    prof = load_run_profile("cpu-tiny")
    cfg = run_config_from_profile(prof, "fig3", "EAGLE-3", out=str(tmp_path / "run"), seed=0, warm_start=warm)
    tr = CoTrainer(cfg, tokenizer_for_run(cfg, out=tmp_path / "tok", seed=0, warm_start=warm))
    with torch.no_grad():                       # a policy and draft that differ from the warm start's
        for p in [*tr.policy.model.parameters(), *tr.draft.parameters()]:
            p.mul_(0.98)
    tr.save(7)
    rep = workload_law.workload_law(prof, "fig3", ["eagle3", "dflash"], warm_start=warm, prompts=2, group=4,
                                    calls=1, budget_s=60, alpha=1e-3, seed=0, workdir=tmp_path / "wl",
                                    from_run=str(tmp_path / "run"))
    assert rep["from_run"]["step"] == 7 and rep["from_run"]["draft_family"] == "eagle3"
    assert rep["arms"]["eagle3"]["draft_from_run"] and not rep["arms"]["dflash"]["draft_from_run"]
    plain = workload_law.workload_law(prof, "fig3", ["eagle3"], warm_start=warm, prompts=2, group=4, calls=1,
                                      budget_s=60, alpha=1e-3, seed=0, workdir=tmp_path / "wl2")
    assert plain["arms"]["none"]["token_logprob"] != rep["arms"]["none"]["token_logprob"]   # another policy
    with pytest.raises(SystemExit):
        workload_law.main(["--out", str(tmp_path / "o"), "--profile", "cpu-tiny", "--warm-start", warm,
                           "--from-run", str(tmp_path / "nothing")])
