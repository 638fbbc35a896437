"""repro.bench.cotrain_checks on CPU: both checks pass on the suite's code, and each fails when its claim is broken
(a verifier that ignores the draft's proposal law; a block draft attached to the policy without the stop-gradient).

    .venv/bin/python -m pytest -q tests/rl/test_cotrain_checks.py
"""
import json

import pytest
import torch

from repro.bench import cotrain_checks
from tests.rollout.helpers import verify_skipping_the_residual


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.timeout(240)
def test_both_checks_pass_on_cpu(tmp_path):
    rc = cotrain_checks.main(["--out", str(tmp_path), "--profile", "cpu-tiny", "--samples", "3000",
                              "--chunk", "1500"])
    rep = json.loads((tmp_path / "cotrain_checks.json").read_text())
    assert rc == 0 and rep["passed"]
    law, upd = rep["checks"]["law"], rep["checks"]["update"]
    assert set(law["families"]) == {"none", "eagle3", "dflash", "dspark"}
    for fam in ("eagle3", "dflash", "dspark"):
        assert 1.05 < law["families"][fam]["acceptance_length"] < 2.5     # both accepted and rejected proposals
        assert upd["families"][fam]["tensors_differing"] == 0 and upd["families"][fam]["same_start"]
    assert upd["updated"] and upd["control_no_draft"]["tensors_differing"] == 0
    assert law["init_std"] == 0.2 and law["first_token_entropy"] >= cotrain_checks.MIN_ENTROPY   # auto's choice
    assert rep["provenance"]["hardware"]


@pytest.mark.timeout(120)
def test_law_check_rejects_a_verifier_that_skips_the_residual(tmp_path, monkeypatch):
    monkeypatch.setattr("repro.rollout.engine.verify", verify_skipping_the_residual)
    rc = cotrain_checks.main(["--out", str(tmp_path), "--profile", "cpu-tiny", "--checks", "law",
                              "--families", "eagle3", "--samples", "3000", "--chunk", "1500"])
    law = json.loads((tmp_path / "cotrain_checks.json").read_text())["checks"]["law"]
    assert rc == 1 and not law["passed"]
    assert law["families"]["none"]["passed"]                 # the control has no proposals to mis-verify
    assert min(law["families"]["eagle3"]["p_y1y2"], law["families"]["eagle3"]["p_y2y3"]) < 1e-6


@pytest.mark.timeout(120)
def test_update_check_rejects_a_draft_without_the_stop_gradient(tmp_path, monkeypatch):
    monkeypatch.setattr("repro.rl.drafts.StopGradParts", lambda policy: policy)     # the live head
    rc = cotrain_checks.main(["--out", str(tmp_path), "--profile", "cpu-tiny", "--checks", "update",
                              "--families", "dflash"])
    upd = json.loads((tmp_path / "cotrain_checks.json").read_text())["checks"]["update"]
    assert rc == 1 and not upd["families"]["dflash"]["passed"]
    assert upd["families"]["dflash"]["tensors_differing"] > 0 and upd["control_no_draft"]["tensors_differing"] == 0


@pytest.mark.timeout(120)
def test_a_check_that_raises_is_recorded_as_failed(tmp_path, monkeypatch):
    def broken(*a, **kw):
        raise RuntimeError("no trainer today")

    monkeypatch.setattr(cotrain_checks, "update_check", broken)
    rc = cotrain_checks.main(["--out", str(tmp_path), "--profile", "cpu-tiny", "--checks", "update,law",
                              "--families", "dflash", "--samples", "1000", "--law-dtype", "bfloat16"])
    rep = json.loads((tmp_path / "cotrain_checks.json").read_text())
    assert rc == 1 and rep["checks"]["update"] == {"error": "RuntimeError: no trainer today", "passed": False}
    assert rep["checks"]["law"]["passed"] and rep["checks"]["law"]["dtype"] == "torch.bfloat16"


def test_bad_arguments_fail_clearly(tmp_path, capsys):
    for argv, msg in ((["--checks", "speed"], "--checks 'speed': expected law, update"),
                      (["--families", "medusa"], "--families ['medusa']: not drafts of profile"),
                      (["--samples", "0"], "--samples 0: expected a positive integer"),
                      (["--alpha", "2"], "--alpha 2.0: expected a level between 0 and 1"),
                      (["--init-std", "wide"], "--init-std 'wide': expected auto or a positive number")):
        with pytest.raises(SystemExit):
            cotrain_checks.main(["--out", str(tmp_path), "--profile", "cpu-tiny", *argv])
        assert msg in capsys.readouterr().err
