"""The decode benchmark program: its settings reader, CLI, envcheck floor, and a deadline that skips points but
still writes bench.json.

    .venv/bin/python -m pytest -q tests/rollout/test_decode_bench.py
"""
import itertools
import json

import pytest
import torch
import transformers
import yaml

from repro.bench import decode
from repro.core.profile import PROFILE_DIR, ProfileError

HF_DYNAMIC_ABOUT = f"transformers {transformers.__version__}, torch {torch.__version__}"
TINY = {"scale": "tiny", "vocab_size": 64, "lang_tokens": 50, "pretrain_steps": 2, "train_prompts": 4,
        "prompt_len": 4, "sample_tokens": 4, "train_steps": 1, "new_tokens": 4, "batch_sizes": [1, 2],
        "repeats": 1, "families": ["dspark"], "engine_modes": [False, "all"], "peers": ["hf-dynamic", "vllm"],
        "block_layers": 1}


def profile_file(tmp_path, decode_section):
    prof = yaml.safe_load((PROFILE_DIR / "cpu-tiny.yaml").read_text())
    prof.pop("decode", None)
    if decode_section is not None:
        prof["decode"] = decode_section
    path = tmp_path / "prof.yaml"
    path.write_text(yaml.safe_dump(prof))
    return path


def test_help_and_bad_arguments(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        decode.main(["--help"])
    assert e.value.code == 0 and "--profile" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"--families \['medusa'\]"):
        decode.main(["--profile", "cpu-tiny", "--out", str(tmp_path), "--families", "medusa"])
    with pytest.raises(SystemExit, match=r"--modes \['full'\]"):
        decode.main(["--profile", "cpu-tiny", "--out", str(tmp_path), "--modes", "full"])
    with pytest.raises(Exception, match="unknown profile 'tpu'"):
        decode.main(["--profile", "tpu", "--out", str(tmp_path)])
    with pytest.raises(ProfileError, match="has no decode: section"):
        decode.run(str(profile_file(tmp_path, None)), tmp_path / "x")
    with pytest.raises(ValueError, match="no copy_bw_gbps found"):
        decode.run(str(profile_file(tmp_path, TINY)), tmp_path / "x", envcheck=str(tmp_path))
    assert not (tmp_path / "x").exists()


def test_settings_reader():
    s = decode.decode_settings(TINY, "p", {"repeats": 5, "train_steps": None})
    assert s.engine_modes == ("off", "all") and s.repeats == 5 and s.train_steps == 1 and s.batch_sizes == (1, 2)
    with pytest.raises(ProfileError, match=r"decode.batch: unknown key 'batch'; expected one of"):
        decode.decode_settings({**TINY, "batch": 3}, "p")
    with pytest.raises(ProfileError, match=r"decode.lang_tokens: missing"):
        decode.decode_settings({"scale": "tiny", "vocab_size": 64}, "p")
    with pytest.raises(ProfileError, match=r"decode.lang_tokens=64 is invalid"):
        decode.decode_settings({**TINY, "lang_tokens": 64}, "p")
    with pytest.raises(ProfileError, match=r"decode.peers.0: 'sglang' is invalid"):
        decode.decode_settings({**TINY, "peers": ["sglang"]}, "p")


def test_envcheck_bandwidth(tmp_path):
    (tmp_path / "env.json").write_text(json.dumps({"ceilings": {"copy_bw_gbps": 12.5}}))
    assert decode.copy_bandwidth_gbps(tmp_path) == 12.5
    b = tmp_path / "bench.json"
    b.write_text(json.dumps({"records": [{"row": "matmul", "metrics": {}}, {"row": "copy",
                                                                            "metrics": {"copy_bw_gbps": 7.0}}]}))
    assert decode.copy_bandwidth_gbps(b) == 7.0


@pytest.mark.timeout(180)
def test_run_writes_every_row_kind(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "env.json").write_text(json.dumps({"ceilings": {"copy_bw_gbps": 10.0}}))
    decode.run(str(profile_file(tmp_path, TINY)), tmp_path / "run", {"batch_sizes": (2,)},
               envcheck=str(tmp_path / "env"))
    bench = json.loads((tmp_path / "run" / "bench.json").read_text())
    rows = {r["row"]: r for r in bench["records"]}
    for row in ("suite-off/plain/b2", "suite-all/plain/b2", "suite-off/dspark/b2", "suite-all/dspark/b2",
                "bound/dspark/b2", "peer/hf-dynamic/b2", "floor/b2", "identity/dspark/all"):
        assert row in rows, sorted(rows)
    assert rows["identity/dspark/all"]["metrics"]["greedy_identical_frac"] == 1.0
    spec = rows["suite-all/dspark/b2"]["metrics"]
    assert spec["speedup_over_al"] == pytest.approx(spec["speedup"] / spec["acceptance_length"])
    assert 0.5 < spec["occupancy"] <= 1.0           # two rows: each step has at least one of them generating
    for row in ("suite-all/dspark/b2", "peer/hf-dynamic/b2"):     # the warm-up call (compiles, captures) is kept
        assert rows[row]["metrics"]["first_call_s"] > 0
    assert rows["floor/b2"]["metrics"]["ms_per_step"] == pytest.approx(
        bench["config"]["policy_weight_bytes"] / 10e9 * 1e3)
    assert bench["config"]["peer_status"]["vllm"].startswith("unavailable: vllm is not importable")
    assert bench["config"]["peer_status"]["hf-dynamic"] == f"ran: {HF_DYNAMIC_ABOUT}"
    assert bench["config"]["engine_modes"] == ["off", "all"]


@pytest.mark.timeout(120)
def test_deadline_skips_points_and_writes_bench_json(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    decode.run(str(profile_file(tmp_path, TINY)), tmp_path / "run", deadline_s=0.0)
    bench = json.loads((tmp_path / "run" / "bench.json").read_text())
    rows = [r["row"] for r in bench["records"]]
    assert rows[:3] == ["pretrain", "sample", "train/dspark"] and "identity/dspark/off" in rows
    assert not any(r.startswith("suite-") for r in rows)
    assert bench["config"]["skipped_for_deadline"] == ["b1", "b2", "dspark/greedy"]
    assert bench["config"]["floor"].startswith("skipped: no --envcheck")


@pytest.mark.timeout(120)
def test_profile_deadline_skips_modes_and_peers_not_started(tmp_path, monkeypatch):
    """The profile's deadline_s is the run's; once it passes inside a batch, the modes and peers not yet started are
    skipped and listed, and what did run is kept."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert decode.decode_settings({**TINY, "deadline_s": 30}, "t").deadline_s == 30.0
    clock = [0.0]
    monkeypatch.setattr(decode.time, "monotonic", lambda: clock[0])
    late = itertools.chain([False], itertools.repeat(True))   # b1's first mode runs, then time is up
    real_sweep = decode.sweep_batch

    def sweep_late(*a):
        """The clock passes the deadline inside each sweep (after b1's first mode), and is back after it."""
        def skip(point):
            if next(late):
                clock[0] = 1e9
            return a[-1](point)
        real_sweep(*a[:-1], skip)
        clock[0] = 0.0
    monkeypatch.setattr(decode, "sweep_batch", sweep_late)
    decode.run(str(profile_file(tmp_path, {**TINY, "deadline_s": 1000.0})), tmp_path / "run")
    bench = json.loads((tmp_path / "run" / "bench.json").read_text())
    rows = [r["row"] for r in bench["records"]]
    assert "suite-off/plain/b1" in rows and "suite-all/plain/b1" not in rows
    assert {"suite-all/b1", "suite-off/b2", "suite-all/b2"} <= set(bench["config"]["skipped_for_deadline"])
    assert "peer/hf-dynamic/b1" in rows          # the run's own deadline (1000 s) has not passed


@pytest.mark.timeout(240)
def test_an_interrupted_run_continues_where_it_stopped(tmp_path, monkeypatch):
    """A run killed in its second batch keeps its trained models (decode_state.pt) and its measured points (the
    journal); the same command then trains nothing, re-times nothing that was measured, and ends with every row in
    bench.json, the state and the journal removed."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    prof, out = str(profile_file(tmp_path, TINY)), tmp_path / "run"
    real_peers = decode.peers_batch

    def killed_in_b2(bench, timer, policy, s, prompts, B, *rest, **kw):
        if B == 2:
            raise KeyboardInterrupt
        return real_peers(bench, timer, policy, s, prompts, B, *rest, **kw)
    monkeypatch.setattr(decode, "peers_batch", killed_in_b2)
    with pytest.raises(KeyboardInterrupt):
        decode.run(prof, out)
    assert (out / decode.STATE).exists() and (out / "bench.partial.jsonl").exists()
    assert not (out / "bench.json").exists()

    monkeypatch.setattr(decode, "peers_batch", real_peers)
    trained, timed = [], []
    monkeypatch.setattr(decode, "pretrain_policy", lambda *a, **k: trained.append("policy") or [0.0])
    monkeypatch.setattr(decode, "train_draft", lambda *a, **k: trained.append("draft") or [0.0])
    real_timer = decode.Timer.__call__
    monkeypatch.setattr(decode.Timer, "__call__",
                        lambda self, fn, *a, **k: timed.append(fn) or real_timer(self, fn, *a, **k))
    decode.run(prof, out)
    assert trained == [] and len(timed) == 1          # only batch 2's peer, which the kill cut off, is timed
    bench = json.loads((out / "bench.json").read_text())
    rows = [r["row"] for r in bench["records"]]
    resumed = set(bench["summary"]["resumed_rows"])
    assert {"pretrain", "sample", "train/dspark", "suite-off/plain/b1", "suite-all/dspark/b1", "peer/hf-dynamic/b1",
            "suite-off/plain/b2", "suite-all/dspark/b2"} <= resumed
    assert "peer/hf-dynamic/b2" in rows and "peer/hf-dynamic/b2" not in resumed
    # the status comes from the first peer row, carried: it keeps the versions the earlier attempt ran with
    assert bench["config"]["peer_status"]["hf-dynamic"] == f"ran: {HF_DYNAMIC_ABOUT}"
    assert len(rows) == len(set(rows)) and {"bound/dspark/b2", "dspark/greedy"} <= set(rows)
    spec = next(r for r in bench["records"] if r["row"] == "suite-all/dspark/b2")["metrics"]
    assert spec["speedup"] > 0
    assert not (out / decode.STATE).exists() and not (out / "bench.partial.jsonl").exists()


@pytest.mark.timeout(120)
def test_bound_times_the_compiled_step_on_a_gpu_run_with_a_compiled_mode(monkeypatch):
    import contextlib

    from repro.models.policy import build_policy
    policy = build_policy("qwen3", "tiny", head_dim=32)
    assert decode.bound_step(policy, ["off", "all", "fused"]) is None          # a CPU: the static step
    gpu = type("GpuPolicy", (), {"device": torch.device("cuda")})()
    assert decode.bound_step(gpu, ["compiled"]) == "inductor"
    assert decode.bound_step(gpu, ["off", "all"]) is None
    entered = []

    @contextlib.contextmanager
    def layers(p, backend):                   # the engine's compiled_layers, recorded (its compile: test_cuda_graphs)
        entered.append((p, backend))
        yield

    monkeypatch.setattr(decode, "compiled_layers", layers)
    with torch.no_grad():
        assert decode.policy_step_ratio(policy, 2, 3, 4, 1)[0] > 0
        assert entered and set(entered) == {(policy, None)}, "static: every step asked for no compiled layers"
        entered.clear()
        ratio, verify_s, decode_s = decode.policy_step_ratio(policy, 2, 3, 4, 1, compile_backend="inductor")
    assert ratio == pytest.approx(verify_s / decode_s) and verify_s > 0 and decode_s > 0
    assert len(entered) >= 20 and set(entered) == {(policy, "inductor")}, "every step ran in the compiled layers"
