"""W&B logs that use NeMo-RL's metric names become the same tidy table as the suite's own runs.

A NeMo-RL run is imitated with the real wandb package (offline) the way NeMo-RL's WandbLogger
writes it: wandb.init(**logger.wandb of the generated config, dir=<log_dir>/exp_001/wandb), the full
config through run.config.update, several log calls per step with NeMo-RL's prefixed keys, the last
one committing the step. Its run folder and env.json come from ``integrations.nemo_rl.run --config-only``.
The same numbers logged through the suite's MetricsLogger under the suite's names must collect into
identical tidy rows.

    .venv/bin/python -m pytest -q tests/integrations/nemo_rl/test_nemo_rl_collect.py
"""
from __future__ import annotations

import json
import os

import pytest
import yaml
from fake_checkout import fake_uv, make_checkout, make_data

from integrations.nemo_rl.finish import main as finish_main
from integrations.nemo_rl.metrics import nemo_rl_mapper
from integrations.nemo_rl.run import main, run_slug
from integrations.nemo_rl.runtime_env import runtime_env
from repro.core.metrics import MetricsLogger
from repro.core.profile import load_profile
from repro.report.collect import collect

pytestmark = pytest.mark.timeout(120)

ROW = "Qwen3-8B/DFlash"
BASE = "Qwen3-8B/no draft"
SAMPLES = 64 * 32          # prompts x generations per step of the generated config
STEPS = {  # step -> the suite's per-step names and values (repro/rl/trainer.py) of that step
    1: {"train/reward": 0.25, "train/train_inference_kl": 6.5e-4, "train/kl_ref": 0.002, "train/draft_loss": 2.5,
        "train/policy_grad_norm": 0.5, "train/response_len": 6000.0, "train/acceptance_length": 2.75,
        "train/acceptance_rate": 0.125, "train/acceptance_rate_pos0": 0.5, "train/acceptance_rate_pos1": 0.25,
        "train/rollout_time_s": 230.0, "train/update_time_s": 36.0, "train/step_time_s": 270.0,
        "train/weight_push_s": 3.0},
    2: {"train/reward": 0.375, "train/train_inference_kl": 6.25e-4, "train/kl_ref": 0.003, "train/draft_loss": 2.0,
        "train/policy_grad_norm": 0.25, "train/response_len": 6500.0, "train/acceptance_length": 3.0,
        "train/acceptance_rate": 0.1875, "train/acceptance_rate_pos0": 0.625, "train/acceptance_rate_pos1": 0.375,
        "train/rollout_time_s": 225.5, "train/update_time_s": 35.5, "train/step_time_s": 265.0,
        "train/weight_push_s": 3.5, "val/accuracy": 0.2},
}
for _m in STEPS.values():   # what the suite's trainer derives from the same step
    _m["train/gen_tokens"] = _m["train/response_len"] * SAMPLES
    _m["train/throughput_tok_s"] = _m["train/gen_tokens"] / _m["train/step_time_s"]
    _m["train/rollout_tok_s"] = _m["train/gen_tokens"] / _m["train/rollout_time_s"]


def nemo_rl_logs(step: int, m: dict, drafts: float) -> list[tuple[dict, bool]]:
    """The W&B log calls NeMo-RL's grpo_train makes for one step, with NeMo-RL's key names."""
    rollout = {"train/mean_gen_tokens_per_sample": m["train/response_len"], "train/total_turns": SAMPLES,
               "train/truncation_rate": 0.01}
    train = {"train/reward": m["train/reward"], "train/gen_kl_error": m["train/train_inference_kl"],
             "train/kl_penalty": m["train/kl_ref"], "train/loss": -0.01, "train/grad_norm": m["train/policy_grad_norm"],
             "train/vllm/spec_num_drafts": drafts, "train/vllm/spec_num_draft_tokens": drafts * 15,
             "train/vllm/spec_acceptance_length": m["train/acceptance_length"] if drafts else 1.0,
             "train/vllm/spec_acceptance_rate": m["train/acceptance_rate"] if drafts else 0.0}
    if drafts:
        train.update({"train/draft_loss": m["train/draft_loss"],
                      "train/vllm/spec_acceptance_rate-pos-0": m["train/acceptance_rate_pos0"],
                      "train/vllm/spec_acceptance_rate-pos-1": m["train/acceptance_rate_pos1"],
                      "train/vllm/vllm:spec_decode_num_accepted_tokens_per_pos-0":
                          drafts * m["train/acceptance_rate_pos0"]})
    calls = [(rollout, False)]
    if "val/accuracy" in m:
        calls.append(({"validation/accuracy": m["val/accuracy"], "validation/avg_length": 900.0}, False))
    calls += [(train, False),
              ({"performance/samples_per_sec": SAMPLES / m["train/step_time_s"], "performance/tokens_per_sec": 1e5},
               False),
              ({"timing/train/generation": m["train/rollout_time_s"],
                "timing/train/policy_training": m["train/update_time_s"],
                "timing/train/total_step_time": m["train/step_time_s"],
                "timing/train/prepare_for_generation/transfer_and_update_weights": m["train/weight_push_s"]}, True)]
    return calls


def fake_nemo_rl_run(run_dir, drafts: float) -> None:
    """Log like NeMo-RL's Logger/WandbLogger, configured by the generated config."""
    import wandb
    cfg = yaml.safe_load((run_dir / "nemo_rl_config.yaml").read_text())
    wandb_dir = run_dir / "nemo_rl_logs" / "exp_001" / "wandb"       # get_next_experiment_dir + "wandb"
    wandb_dir.mkdir(parents=True)
    # mode is explicit: an earlier test in this process may have set up wandb's singleton before WANDB_MODE was set
    run = wandb.init(**cfg["logger"]["wandb"], dir=str(wandb_dir), mode="offline",
                     settings=wandb.Settings(console="off", x_disable_stats=True, x_disable_meta=True))
    run.config.update({k: v for k, v in cfg.items() if k != "logger"}, allow_val_change=True)
    for step, metrics in STEPS.items():
        for payload, commit in nemo_rl_logs(step, metrics, drafts):
            run.log(payload, step=step, commit=True if commit else None)
    run.finish()


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("PATH", f"{fake_uv(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}")
    profile = load_profile("paper-h100")
    data, nemo = make_data(tmp_path / "d", profile), make_checkout(tmp_path / "RL")
    root = tmp_path / "results"
    for row, drafts in ((ROW, 400.0), (BASE, 0.0)):
        out = root / "hw" / "paper-h100" / "table1" / "nemo-rl" / run_slug(row)
        assert main(["--profile", "paper-h100", "--artifact", "table1", "--row", row, "--out", str(out),
                     "--nemo-rl-dir", str(nemo), "--checkpoint-root", str(data["checkpoint_root"]),
                     "--hf-home", str(data["hf_home"]), "--config-only"]) == 0
        env = json.loads((out / "env.json").read_text())
        assert (env["engine"], env["artifact"], env["profile"], env["row"]) == ("nemo-rl", "table1", "paper-h100", row)
        fake_nemo_rl_run(out, drafts)
    with MetricsLogger(root / "hw" / "paper-h100" / "table1" / "suite", artifact="table1",
                       profile="paper-h100", config={}) as log:
        for step, metrics in STEPS.items():
            log.log(metrics, row=ROW, step=step)
    return root


def test_nemo_rl_logs_collect_like_the_suites(results):
    tidy, runs, bad = collect(results)
    assert not bad, bad
    assert set(runs["engine"]) == {"nemo-rl", "suite"} and runs["finished"].all()
    key = ["artifact", "profile", "hardware", "row", "step", "metric"]

    def rows(engine, row=ROW):
        sel = tidy[(tidy["engine"] == engine) & (tidy["row"] == row)]
        return {tuple(r[:-1]): r[-1] for r in sel[key + ["value"]].itertuples(index=False)}

    nemo, suite = rows("nemo-rl"), rows("suite")
    assert nemo.keys() == suite.keys() and len(suite) == sum(len(m) for m in STEPS.values())
    assert all(nemo[k] == pytest.approx(suite[k], rel=1e-12) for k in suite)
    # The baseline logged acceptance length 1.0 with zero drafts: not an acceptance measurement.
    base = set(tidy[(tidy["engine"] == "nemo-rl") & (tidy["row"] == BASE)]["metric"])
    assert not any("accept" in m or "draft" in m for m in base) and "train/rollout_time_s" in base


def test_finish_writes_the_suites_sidecar_and_marker(results):
    run = results / "hw" / "paper-h100" / "table1" / "nemo-rl" / run_slug(ROW)
    assert not (run / "run.json").exists()
    assert finish_main([str(run)]) == 0
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and {s["row"] for s in steps} == {ROW}
    for s in steps:
        want = STEPS[s["step"]]
        assert set(s) - {"row", "step"} == set(want)
        assert all(s[k] == pytest.approx(v, rel=1e-12) for k, v in want.items())
    marker = json.loads((run / "run.json").read_text())
    assert (marker["artifact"], marker["row"], marker["engine"], marker["steps"]) == ("table1", ROW, "nemo-rl", 2)


def test_a_finished_run_collects_the_same_from_its_sidecar(results):
    """After finish, collect reads the run's metrics.jsonl (the suite's names), not its W&B logs: the same rows."""
    key = ["artifact", "profile", "hardware", "run", "row", "step", "metric", "value"]
    before, _, _ = collect(results)
    assert finish_main([str(results / "hw" / "paper-h100" / "table1" / "nemo-rl" / run_slug(ROW))]) == 0
    after, runs, bad = collect(results)
    assert not bad and "metrics.jsonl" in set(runs[runs["engine"] == "nemo-rl"]["source"])
    assert after[key].equals(before[key])


def test_finish_without_logs_fails_clearly(tmp_path, capsys):
    (tmp_path / "env.json").write_text(json.dumps({"artifact": "table1", "row": ROW, "profile": "paper-h100"}))
    assert finish_main([str(tmp_path)]) == 2
    assert "no W&B log" in capsys.readouterr().err and not (tmp_path / "run.json").exists()


def test_mapper_needs_the_row_and_skips_non_numbers():
    with pytest.raises(ValueError, match="without its paper row"):
        nemo_rl_mapper({"train/reward": 1.0})
    got = nemo_rl_mapper({"row": ROW, "train/reward": float("nan"), "timing/train/generation": 12,
                          "train/vllm/spec_num_drafts": 3, "train/vllm/spec_acceptance_length": True,
                          "train/vllm/spec_acceptance_rate-pos-2": 0.5, "_step": 4})
    assert got == [(ROW, "train/rollout_time_s", 12.0), (ROW, "train/acceptance_rate_pos2", 0.5)]


def test_runtime_env_records_the_running_machine():
    env = {"artifact": "table1", "row": ROW, "engine": "nemo-rl", "config": {"row": ROW}, "date": "d0",
           "hardware": {"tag": "cpu-8c", "hostname": "login1"}}
    detected = {"hardware": {"tag": "4xgb200", "hostname": "node7", "gpus": {"count": 4}}, "date": "d1",
                "software": {"torch": "2.11"}, "config": {}}
    out = runtime_env(env, detected, nodes=8)
    assert out["hardware"]["tag"] == "8n-4xgb200" and out["hardware"]["nodes"] == 8
    assert out["generated_on"] == {"tag": "cpu-8c", "hostname": "login1", "date": "d0"}
    assert (out["row"], out["engine"], out["config"], out["date"]) == (ROW, "nemo-rl", {"row": ROW}, "d1")
    assert runtime_env(env, detected, nodes=1)["hardware"]["tag"] == "4xgb200"
