"""The SFT warm start's settings and held-out curve: ``rl.sft.workloads.<w>`` overrides the common settings for one
workload only, bad overrides fail naming the key, ``--heldout-every`` records held-out accuracy along the way
without changing what is trained, and ``draft_workload`` warm-starts the drafts on another workload's data.

    .venv/bin/python -m pytest -q tests/rl/test_sft.py
"""
import copy
import json

import pytest
import yaml

from repro.core.profile import load_profile
from repro.core.specs import ConfigError, sft_spec
from repro.rl.config import run_config_from_profile
from repro.rl.sft import main as sft_main

pytestmark = pytest.mark.timeout(300)


def test_a_workload_override_changes_that_workload_only():
    prof = load_profile("cpu-tiny")
    rl = copy.deepcopy(prof["rl"])
    base = sft_spec(rl, "workplace")
    rl["sft"]["workloads"] = {"workplace": {"steps": 7}}
    assert sft_spec(rl, "workplace").steps == 7 and sft_spec(rl, "math") == sft_spec(prof["rl"], "math")
    assert sft_spec(rl, "workplace").batch == base.batch
    over = copy.deepcopy(prof)
    over["rl"] = rl
    assert run_config_from_profile(over, "fig4", "no draft", out="x").sft.steps == 7
    assert run_config_from_profile(over, "fig3", "no draft", out="x").sft.steps == base.steps
    with pytest.raises(ConfigError, match=r"rl.sft.workloads has unknown workloads \['chess'\]"):
        sft_spec({"sft": {"workloads": {"chess": {"steps": 1}}}}, "math")
    with pytest.raises(ConfigError, match=r"config rl.sft.stepz: unknown key 'stepz'; expected one of batch,"):
        sft_spec({"sft": {"workloads": {"math": {"stepz": 1}}}}, "math")


def test_heldout_curve_is_recorded_and_does_not_change_training(tmp_path, capsys):
    prof = load_profile("cpu-tiny")
    prof["rl"]["sft"] = {**prof["rl"]["sft"], "steps": 4, "draft_steps": 0}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof))
    base = ["--profile", str(path), "--policy", "dense", "--workload", "math", "--threads", "1"]
    assert sft_main(base + ["--out", str(tmp_path / "plain")]) == 0
    assert sft_main(base + ["--out", str(tmp_path / "curve"), "--heldout-every", "2"]) == 0
    plain, curve = (json.loads((tmp_path / d / "sft.json").read_text()) for d in ("plain", "curve"))
    assert "heldout_curve" not in plain
    assert [s for s, _ in curve["heldout_curve"]] == [2, 4]
    assert curve["sft_losses"] == plain["sft_losses"], "evaluating along the way changed the training"
    assert curve["heldout_curve"][-1][1] == curve["heldout_accuracy"] == plain["heldout_accuracy"]
    assert sft_main(base + ["--out", str(tmp_path / "bad"), "--heldout-every", "-1"]) == 2
    assert "--heldout-every -1 is invalid" in capsys.readouterr().err


def test_drafts_can_be_warm_started_on_another_workload(tmp_path, monkeypatch):
    """``rl.sft.draft_workload``: the policy learns its own workload's demonstrations, the drafts another's (the
    paper's drafts are trained offline on other data than the RL task)."""
    import repro.rl.sft as sft
    seen = []
    real = sft._items

    def spy(workload, seed, n, draw, math_ops):
        seen.append((workload, "draft" if draw >= 20_000 else "policy"))
        items = real(workload, seed, n, draw, math_ops)
        if workload == "math":     # the profile's rl.workload.math_ops reach the drafts' math demonstrations
            assert {len(p.ops) for p in items} <= {5, 6}, items
        return items
    monkeypatch.setattr(sft, "_items", spy)
    prof = load_profile("cpu-tiny")
    prof["rl"]["workload"]["math_ops"] = [5, 6]
    prof["rl"]["sft"] = {**prof["rl"]["sft"], "steps": 2, "draft_steps": 2, "workloads": {
        "workplace": {"draft_workload": "math"}}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof))
    assert sft_main(["--profile", str(path), "--policy", "dense", "--workload", "workplace", "--drafts", "dflash",
                     "--threads", "1", "--out", str(tmp_path / "w")]) == 0
    assert set(seen) == {("workplace", "policy"), ("math", "draft")}
    assert json.loads((tmp_path / "w" / "sft.json").read_text())["sft"]["draft_workload"] == "math"
    with pytest.raises(ConfigError, match="sft.draft_workload='chess'"):
        sft_spec({"sft": {"draft_workload": "chess"}}, "math").validate()


def test_deterministic_draft_training_is_the_same_training_on_cpu(tmp_path, monkeypatch):
    """``rl.sft.deterministic``: the drafts train under torch's deterministic kernels and the setting is restored
    after. CPU kernels are deterministic already, so the losses equal the default's; a non-bool is refused."""
    import torch

    import repro.rl.sft as sft
    seen = []
    real = sft.warm_start_drafts

    def spy(*args, **kwargs):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return real(*args, **kwargs)
    monkeypatch.setattr(sft, "warm_start_drafts", spy)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    runs = {}
    for det in (False, True):
        prof = load_profile("cpu-tiny")
        prof["rl"]["sft"] = {**prof["rl"]["sft"], "steps": 2, "draft_steps": 3, "deterministic": det}
        path = tmp_path / f"p{det}.yaml"
        path.write_text(yaml.safe_dump(prof))
        assert sft_main(["--profile", str(path), "--policy", "dense", "--workload", "math", "--drafts",
                         "dflash,dspark", "--threads", "1", "--out", str(tmp_path / str(det))]) == 0
        runs[det] = json.loads((tmp_path / str(det) / "sft.json").read_text())
    assert seen == [False, True] and not torch.are_deterministic_algorithms_enabled()
    assert runs[True]["sft"]["deterministic"] is True
    assert runs[True]["drafts"] == runs[False]["drafts"] and runs[True]["sft_losses"] == runs[False]["sft_losses"]
    assert sft.os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    with pytest.raises(ConfigError, match=r"rl.sft is invalid \(deterministic: Input should be a valid boolean"):
        sft_spec({"sft": {"deterministic": "yes"}}, "math").validate()


def test_a_drafts_warm_start_does_not_depend_on_the_other_drafts(tmp_path):
    """Each draft trains from its own seed (``draft_seed``): warm-starting DSpark alone, after DFlash or before it
    gives the same DSpark, so a device call that runs one draft's rows reuses nothing by accident and misses
    nothing."""
    prof = load_profile("cpu-tiny")
    prof["rl"]["sft"] = {**prof["rl"]["sft"], "steps": 1, "draft_steps": 3}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof))
    runs = {}
    for names in ("dspark", "dflash,dspark", "dspark,dflash"):
        assert sft_main(["--profile", str(path), "--policy", "dense", "--workload", "math", "--drafts", names,
                         "--threads", "1", "--out", str(tmp_path / names)]) == 0
        runs[names] = json.loads((tmp_path / names / "sft.json").read_text())["drafts"]
    assert runs["dspark"]["dspark"]["losses"] == runs["dflash,dspark"]["dspark"]["losses"] \
        == runs["dspark,dflash"]["dspark"]["losses"]
    assert runs["dflash,dspark"]["dflash"]["losses"] == runs["dspark,dflash"]["dflash"]["losses"]
    from repro.rl.sft import draft_seed
    assert draft_seed(0, "dflash") != draft_seed(0, "dspark") and draft_seed(0, "dflash") != draft_seed(1, "dflash")


def test_on_a_gpu_profile_sft_runs_under_the_profiles_autocast(tmp_path, monkeypatch):
    """The warm start takes the RL update's autocast rule (``update_autocast_dtype``: the profile's dtype on a GPU,
    none on a CPU): the CPU profile records none; under bf16 autocast (here on the CPU) the policy's and the drafts'
    trainings run in bf16 and still learn, and sft.json records the dtype."""
    import torch

    import repro.rl.sft as sft
    from repro.core.specs import DraftSpec, PolicySpec

    prof = load_profile("cpu-tiny")
    prof["rl"]["sft"] = {**prof["rl"]["sft"], "steps": 6, "draft_steps": 3, "batch": 4}   # a CPU runs bf16 slowly
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof))
    assert sft_main(["--profile", str(path), "--policy", "dense", "--workload", "math", "--threads", "1",
                     "--out", str(tmp_path / "cpu")]) == 0
    assert json.loads((tmp_path / "cpu" / "sft.json").read_text())["autocast_dtype"] is None
    seen = []
    real = sft.autocast_or_off
    monkeypatch.setattr(sft, "autocast_or_off", lambda dev, dtype: seen.append(dtype) or real(dev, dtype))
    rl = prof["rl"]
    summary = sft.build_warm_start(tmp_path / "bf16", PolicySpec(**rl["policies"]["dense"]), "math",
                                   sft_spec(rl, "math"), [DraftSpec(**rl["drafts"]["dflash"])],
                                   vocab_size=int(rl["vocab_size"]), autocast_dtype=torch.bfloat16)
    assert summary["autocast_dtype"] == "bfloat16" and set(seen) == {torch.bfloat16}
    assert len(seen) == 6 + 3 * 2                       # each policy step; each draft step's forward and loss
    assert summary["sft_loss_last"] < summary["sft_loss_first"]
    assert all(l == l for l in summary["drafts"]["dflash"]["losses"])            # finite, no NaN


def test_demonstrations_train_without_a_padding_mask_and_lose_nothing(tok):
    """The demonstrations are right-padded, so their batch carries no attention mask (causal attention alone); the
    loss on every demonstrated token equals the one computed with the padding mask."""
    import torch

    from repro.models.policy import build_policy
    from repro.rl.grpo import token_logprobs
    from repro.rl.sft import _items, demo_batch

    ids, att, mask = demo_batch(tok, _items("math", 0, 6, draw=3, math_ops=(2, 5)), "cpu")
    lengths = (ids != tok.pad_id).long().cumprod(1).sum(1)
    assert att is None and lengths.min() < ids.shape[1], "ragged rows expected"
    padded = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
    pol = build_policy("qwen3", "tiny", vocab_size=tok.vocab_size, seed=1, dtype=torch.float64)
    got = token_logprobs(pol.forward_train(ids, want_taps=False, attention_mask=None).logits, ids) * mask
    want = token_logprobs(pol.forward_train(ids, want_taps=False, attention_mask=padded).logits, ids) * mask
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    assert mask[~padded].abs().sum() == 0
