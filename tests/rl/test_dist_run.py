"""The torchrun entry of a distributed co-training row: launched with ``python -m torch.distributed.run`` for
2 steps at PP=2 x CP=1 (EAGLE-3: taps cross the stages) on the cpu-tiny profile, it logs one metrics row
per step with repro.rl.run's names plus the tap wait; bad layouts are refused before any process
group exists.

    .venv/bin/python -m pytest -q tests/rl/test_dist_run.py
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.rl.dist_run import main
from repro.rl.trainer import STEP_METRICS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_torchrun_two_steps_pp2_logs_metrics(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "repro.rl.dist_run", "--artifact", "table1", "--row", "Qwen3-8B/EAGLE-3",
           "--profile", "cpu-tiny",
           "--pp", "2", "--cp", "1", "--microbatch", "8", "--steps", "2", "--threads", "1", "--out", str(out)]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
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
    (tmp_path / "old" / "metrics.jsonl").write_text("{}\n")
    assert main(base[:-1] + [str(tmp_path / "old"), "--pp", "1", "--cp", "2"]) == 2
    assert "does not resume" in capsys.readouterr().err
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
