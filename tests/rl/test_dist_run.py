"""The torchrun entry of a distributed co-training row: launched with ``python -m torch.distributed.run`` for
2 steps at PP=2 x CP=1 (EAGLE-3: taps cross the stages) on the cpu-tiny profile, it logs one metrics row
per step with repro.rl.run's names plus the tap wait; stopped by a signal, it checkpoints every rank and the same
command continues to an uninterrupted run's metrics; bad layouts are refused before any process group exists.

    .venv/bin/python -m pytest -q tests/rl/test_dist_run.py
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.rl.dist_run import main
from repro.rl.trainer import STEP_METRICS

ROOT = Path(__file__).resolve().parents[2]


ENV = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
DETERMINISTIC = ("train/reward", "train/policy_loss", "train/draft_loss", "train/acceptance_length",
                 "train/gen_tokens", "train/train_inference_kl")


def torchrun_row(out: Path, steps: int) -> list[str]:
    """A cpu-tiny EAGLE-3 row under torchrun at PP=2 x CP=1 (the draft's taps cross the stages)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "repro.rl.dist_run", "--artifact", "table1", "--row", "Qwen3-8B/EAGLE-3", "--profile", "cpu-tiny",
            "--pp", "2", "--cp", "1", "--microbatch", "8", "--steps", str(steps), "--threads", "1", "--out", str(out)]


def metrics_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(180)
def test_torchrun_two_steps_pp2_logs_metrics(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(torchrun_row(out, 2), check=False, cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = metrics_of(out)
    assert [r["step"] for r in rows] == [0, 1] and all(r["row"] == "Qwen3-8B/EAGLE-3" for r in rows)
    want = set(STEP_METRICS) | {"train/tap_wait_s", "train/draft_grad_norm", "train/weight_gather_s"}
    for r in rows:
        assert want <= set(r), f"missing metrics {sorted(want - set(r))}"
        assert r["train/update_time_s"] > 0 and r["train/draft_loss"] > 0 and r["train/gen_tokens"] > 0
        assert r["train/tap_wait_s"] > 0, \
            "EAGLE-3's low/mid taps live on stage 0: the draft stage waits on them"
        assert r["train/train_inference_kl"] < 1e-6, "trainer (PP) and engine disagree on the policy"
    env_json = json.loads((out / "env.json").read_text())
    assert env_json["artifact"] == "dist" and env_json["config"]["artifact"] == "table1"
    assert env_json["config"]["parallel"] == {"pp": 2, "cp": 1, "world": 2, "microbatches": 2,
                                              "tap_transport": "shm", "backend": "gloo",
                                              "update_autocast": "off"}
    assert json.loads((out / "run.json").read_text())["parallel"]["pp"] == 2


@pytest.mark.timeout(300)
def test_a_signalled_torchrun_row_checkpoints_every_rank_and_the_same_command_continues(tmp_path):
    """SIGTERM to torchrun, which forwards it to both ranks, once the first step is logged: every rank finishes the
    step in flight and writes its part, rank 0 commits them and the job fails without a run.json. The same command
    then continues after that step (cpu-tiny checkpoints every 10 steps: without the stop a 4-step run starts over)
    and ends with the metrics of an uninterrupted run, beside it, every step logged once."""
    cut, whole = tmp_path / "cut", tmp_path / "whole"
    reference = subprocess.Popen(torchrun_row(whole, 4), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
    stopped = subprocess.Popen(torchrun_row(cut, 4), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        while not ((cut / "metrics.jsonl").is_file() and (cut / "metrics.jsonl").read_text().strip()):
            assert stopped.poll() is None, stopped.stderr.read()[-3000:]
            time.sleep(0.05)
        stopped.send_signal(signal.SIGTERM)          # torchrun alone: it forwards the signal to its workers
        err = stopped.communicate(timeout=120)[1]
        assert stopped.returncode != 0 and not (cut / "run.json").exists(), err[-3000:]
        manifest = json.loads((cut / "ckpt" / "dist" / "latest.json").read_text())
        at = manifest["step"]
        assert 0 <= at < 3 and manifest["layout"] == {"pp": 2, "cp": 1, "world": 2}
        assert sorted(p.name for p in (cut / "ckpt" / "dist" / f"step{at}").iterdir()) == ["rank0.pt", "rank1.pt"]
        assert "stopped after step" in err

        again = subprocess.run(torchrun_row(cut, 4), check=False, cwd=ROOT, env=ENV, capture_output=True,
                               text=True, timeout=170)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert f"resuming at step {at + 1}" in again.stdout
        assert reference.wait(timeout=170) == 0
    finally:                           # a failed check leaves no torchrun or worker behind
        for proc in (stopped, reference):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    got, want = metrics_of(cut), metrics_of(whole)
    assert [r["step"] for r in got] == [0, 1, 2, 3]
    for g, w in zip(got, want):
        assert {k: g[k] for k in DETERMINISTIC} == {k: w[k] for k in DETERMINISTIC}, f"step {g['step']}"
    assert json.loads((cut / "env.json").read_text())["resumes"][0]["at_step"] == at + 1
    assert json.loads((cut / "run.json").read_text())["resumed_at"] == at + 1
    assert not (cut / "ckpt" / "dist").exists(), "a finished run keeps no checkpoint"


def test_bad_layouts_are_refused_before_any_process_group(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    base = ["--artifact", "table1", "--row", "Qwen3-8B/DFlash", "--profile", "cpu-tiny",
            "--out", str(tmp_path / "r")]
    assert main(base + ["--pp", "2", "--cp", "2"]) == 2
    assert "pp*cp=2*2=4 is invalid: expected the world size 2" in capsys.readouterr().err
    assert main(base + ["--pp", "2", "--cp", "1"]) == 2          # cpu-tiny: 16 sequences in one microbatch
    assert "grpo.microbatch=16 is invalid with pp=2" in capsys.readouterr().err
    assert main(["--artifact", "table1", "--row", "nope", "--profile", "cpu-tiny",
                 "--out", str(tmp_path / "r"), "--pp", "1", "--cp", "2"]) == 2
    assert "row='nope' is invalid" in capsys.readouterr().err
    assert main(["--artifact", "table1", "--row", "Qwen3-8B/DFlash", "--profile", "paper-h100", "--out",
                 str(tmp_path / "r"), "--pp", "1", "--cp", "2"]) == 2
    assert "NeMo-RL" in capsys.readouterr().err
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "run.json").write_text("{}\n")
    assert main(base[:-1] + [str(tmp_path / "old"), "--pp", "1", "--cp", "2"]) == 2
    assert "holds a finished run (run.json)" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")                   # 2 nodes of 2: stage 1 on the other node
    assert main(base[:-1] + [str(tmp_path / "r"), "--pp", "2", "--cp", "2", "--microbatch", "4"]) == 2
    assert "spans nodes [0, 1], and shm serves one node" in capsys.readouterr().err
    from repro.rl.dist_run import build_config, parse_args
    cross = parse_args(base[:-1] + [str(tmp_path / "r"), "--pp", "2", "--cp", "2", "--microbatch", "4",
                                    "--tap-transport", "p2p"])
    shape = build_config(cross, world=4)[1]                      # point to point crosses nodes
    assert (shape.pp, shape.cp) == (2, 2)
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0 and "torchrun" in capsys.readouterr().out


def test_single_process_draft_settings_are_reset_under_pp_cp(tmp_path, capsys):
    """h200's block drafts train in one deferred, CUDA-graphed pass of 64 rows (repro.rl.joint); the mesh
    update has no such pass, so dist_run runs them in the last stage's microbatches and says so (was: exit
    2)."""
    import yaml

    from repro.core.profile import load_profile
    from repro.rl.dist_run import build_config, parse_args

    prof = load_profile("h200")
    # only the config is built here, no model
    prof["hardware"]["device"], prof["dtype"] = "cpu", "float32"
    path = tmp_path / "h200_on_cpu.yaml"
    path.write_text(yaml.safe_dump(prof))
    args = parse_args(["--artifact", "table1", "--row", "Qwen3-8B/DFlash", "--profile", str(path),
                       "--out", str(tmp_path / "r"), "--pp", "2", "--cp", "1", "--microbatch", "8"])
    assert prof["rl"]["drafts"]["dflash"]["microbatch"] == 128 and prof["rl"]["drafts"]["dflash"]["cuda_graph"]
    cfg, _, n_mb = build_config(args, world=2)
    assert (cfg.draft.microbatch, cfg.draft.cuda_graph, n_mb) == (0, False, 8)
    err = capsys.readouterr().err
    assert "using draft.microbatch=0, draft.cuda_graph=false" in err
    assert prof["rl"]["grpo"]["compile_layers"] and not cfg.grpo.compile_layers
    assert "using grpo.compile_layers=false" in err
