"""The co-training loop: weight push keeps train and inference in sync, crashed runs resume exactly,
bad configs fail before any model is built, multi-turn rollouts mask what the policy did not write.

    .venv/bin/python -m pytest -q tests/rl/test_trainer.py
"""
import dataclasses
import json
import time

import pytest
import torch

from repro.core.metrics import MetricsLogger
from repro.core.specs import ConfigError, DraftSpec, GRPOSpec, WorkloadSpec
from repro.rl.config import RunConfig, run_config_from_profile
from repro.rl.episodes import workplace_rollout
from repro.rl.grpo import group_advantages
from repro.rl.tasks.workplace import WorkplaceTaskSet
from repro.rl.trainer import CoTrainer
from tests.rl.conftest import tiny_config


def _perturb(module, scale=0.05):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def test_synced_run_has_train_inference_kl_below_1e6(tmp_path, tok):
    tr = CoTrainer(tiny_config(tmp_path, draft="dflash"), tok)
    batch = tr.rollout(0)
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2)
    synced = tr.update.step(batch, adv).train_inference_kl
    assert 0 <= synced < 1e-6
    tr.push()                                       # the update changed the trainer; the engine follows
    assert tr.update.step(tr.rollout(1), adv).train_inference_kl < 1e-6
    # negative control: the trainer moves on without a push -> the engine samples from a stale policy
    _perturb(tr.policy.model)
    stale = tr.update.step(tr.rollout(2), adv).train_inference_kl
    assert stale > 1e-4, stale


def test_a_sampling_seed_replica_keeps_the_prompts_and_changes_only_the_samples(tmp_path, tok):
    """A baseline replica (repro.report.seed_spread) differs from its main run the way a co-trained row does:
    the same prompts, held-out split and init, other random numbers for sampling."""
    main = CoTrainer(tiny_config(tmp_path / "main"), tok)
    same = CoTrainer(tiny_config(tmp_path / "same", sampling_seed=0), tok)      # sampling seed = seed: no change
    rep = CoTrainer(tiny_config(tmp_path / "rep", sampling_seed=5), tok)
    a, b, c = (t.rollout(0) for t in (main, same, rep))
    def prompts(x):                                 # the tokens the policy did not write
        return x.input_ids * (x.loss_mask == 0) * x.attention_mask
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(prompts(a), prompts(c)), "a replica rolls out the same prompts"
    assert not torch.equal(a.input_ids, c.input_ids), "... and samples other responses"
    assert "sampling_seed" not in main.cfg.to_dict() and rep.cfg.to_dict()["sampling_seed"] == 5
    with pytest.raises(ConfigError, match="sampling_seed=-1 is invalid"):
        tiny_config(tmp_path / "bad", sampling_seed=-1).validate()


class Crash(RuntimeError):
    pass


def _train(cfg, tok, crash_at=None):
    tr = CoTrainer(cfg, tok)
    first = tr.try_resume()

    def on_step(step, _):
        if step == crash_at:
            raise Crash(f"injected crash after step {step}")
    with MetricsLogger(cfg.out, artifact="table1", profile="cpu-tiny", config=cfg.to_dict(),
                       resume_at=first or None) as log:
        tr.run(log, on_step=on_step)
    return tr, first


def test_crashed_run_resumes_from_its_checkpoint_without_losing_steps(tmp_path, tok):
    full, _ = _train(tiny_config(tmp_path / "full", draft="dflash", steps=3, ckpt_every=1), tok)
    cfg = tiny_config(tmp_path / "crash", draft="dflash", steps=3, ckpt_every=1)
    with pytest.raises(Crash):
        _train(cfg, tok, crash_at=1)
    resumed, first = _train(cfg, tok)
    assert first == 2
    steps = [json.loads(line)["step"] for line in (tmp_path / "crash" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]
    for a, b in ((full.policy.model, resumed.policy.model), (full.draft, resumed.draft)):
        sa, sb = a.state_dict(), b.state_dict()
        for k in sa:
            assert torch.equal(sa[k], sb[k]), f"{k} differs between the uninterrupted and the resumed run"
    full_rows = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert full_rows[2]["train/draft_loss"] == json.loads(
        (tmp_path / "crash" / "metrics.jsonl").read_text().splitlines()[2])["train/draft_loss"]


def test_a_step_waits_for_the_checkpoint_write_before_its_clock_starts(tmp_path, tok, monkeypatch):
    """A checkpoint written in the background must not run beside a timed step: the next step waits for it first
    and logs the wait apart from its times."""
    import repro.rl.checkpoint as ckpt
    real_save = torch.save

    def slow_save(obj, f):
        time.sleep(1.0)
        real_save(obj, f)
    monkeypatch.setattr(ckpt.torch, "save", slow_save)
    _train(tiny_config(tmp_path, steps=3, ckpt_every=1), tok)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    waits = [r["train/checkpoint_wait_s"] for r in rows]
    assert waits[0] < 0.5 and all(w > 0.5 for w in waits[1:]), waits     # steps 0 and 1 were checkpointed


def _fake_warm_start(root, cfg, seed):
    """A warm-start folder as repro.rl.sft writes it (policy.pt only), with seed-dependent weights."""
    from repro.rl.warmstart import make_policy
    pol = make_policy(dataclasses.replace(cfg.policy), cfg.vocab_size, seed=seed, dtype=torch.float32, device="cpu")
    root.mkdir(parents=True, exist_ok=True)
    torch.save({"family": cfg.policy.family, "scale": cfg.policy.scale, "overrides": dict(cfg.policy.overrides),
                "vocab_size": cfg.vocab_size, "state_dict": pol.model.state_dict()}, root / "policy.pt")


def test_checkpoint_of_a_rebuilt_warm_start_is_dropped_not_resumed(tmp_path, tok, capsys):
    """Same config and warm-start path, other weights (the SFT was rebuilt): the stale checkpoint must not
    be continued; with unchanged weights the run resumes."""
    cfg = tiny_config(tmp_path / "run", steps=2, ckpt_every=1)     # step 0 checkpointed (the last one never is)
    cfg.warm_start = str(tmp_path / "warm")
    _fake_warm_start(tmp_path / "warm", cfg, seed=1)
    _train(cfg, tok)
    assert CoTrainer(cfg, tok).try_resume() == 1                 # same weights: resumes after step 0
    _fake_warm_start(tmp_path / "warm", cfg, seed=2)             # rebuilt: other weights at the same path
    assert CoTrainer(cfg, tok).try_resume() == 0
    assert "another warm start" in capsys.readouterr().err
    assert not (tmp_path / "run" / "ckpt" / "latest.pt").exists()


def test_resume_refuses_a_checkpoint_of_another_config(tmp_path, tok):
    _train(tiny_config(tmp_path, draft="eagle3", steps=2, ckpt_every=1), tok)
    other = tiny_config(tmp_path, draft="dflash", steps=2, ckpt_every=1)
    with pytest.raises(ConfigError, match="different config.*--restart-on-config-change"):
        CoTrainer(other, tok).try_resume()


def test_restart_on_config_change_drops_the_checkpoint_and_starts_over(tmp_path, tok, capsys):
    """The workflow's rerun after a profile change (here the draft's lr warm-up): the old checkpoint is dropped,
    the run starts at step 0; an unchanged config still resumes."""
    cfg = tiny_config(tmp_path, draft="dflash", steps=2, ckpt_every=1)
    _train(cfg, tok)
    assert CoTrainer(cfg, tok).try_resume(restart_on_config_change=True) == 1
    changed = tiny_config(tmp_path, draft="dflash", steps=2, ckpt_every=1)
    changed.draft = dataclasses.replace(changed.draft, lr_warmup_steps=3)
    assert CoTrainer(changed, tok).try_resume(restart_on_config_change=True) == 0
    assert "another config (key 'draft' changed)" in capsys.readouterr().err
    assert not (tmp_path / "ckpt" / "latest.pt").exists()


@pytest.mark.parametrize("change,match", [
    (dict(steps=0), "steps=0"),
    (dict(dtype="bfloat16"), "dtype='bfloat16' on device 'cpu'"),
    (dict(grpo=GRPOSpec(generations_per_prompt=1)), "generations_per_prompt=1"),
    (dict(grpo=GRPOSpec(clip_eps=1.5)), "clip_eps=1.5"),
    (dict(workload=WorkloadSpec(name="chess")), "workload.name='chess'"),
    (dict(workload=WorkloadSpec(val_size=31)), "val_size=31"),
    (dict(draft=DraftSpec("medusa")), "draft.family='medusa'"),
    (dict(draft=DraftSpec("dflash", num_proposals=5, options={"block_size": 4})), "num_proposals=5"),
    (dict(draft=DraftSpec("eagle3", options={"block_size": 4})), r"draft.options=\['block_size'\] is invalid"),
    (dict(draft=DraftSpec("eagle3", loss_weight=-1)), "loss_weight=-1"),
])
def test_bad_configs_fail_before_training(tmp_path, tok, change, match):
    cfg = tiny_config(tmp_path)
    for k, v in change.items():
        setattr(cfg, k, v)
    with pytest.raises(ConfigError, match=match):
        CoTrainer(cfg, tok)


def test_profile_rows_and_cli_fail_cleanly(tmp_path, capsys):
    from repro.core.profile import load_profile
    from repro.rl.run import main
    prof = load_profile("cpu-tiny")
    with pytest.raises(ConfigError, match="row='Qwen3-9B/DFlash' is invalid"):
        run_config_from_profile(prof, "table1", "Qwen3-9B/DFlash", out=str(tmp_path))
    assert main(["--artifact", "table1", "--row", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "row='nope' is invalid" in capsys.readouterr().err
    assert not (tmp_path / "x" / "metrics.jsonl").exists()
    with pytest.raises(ConfigError, match="unknown or missing key"):
        RunConfig.from_dict({"artifact": "table1", "row": "r", "profile": "p", "out": "o", "stepz": 3})


def test_workplace_rollout_masks_observations_and_scores_final_state(tok):
    from repro.rl.sft import demo_sequence
    tasks = WorkplaceTaskSet(seed=0).tasks("train", 2)
    ids, mask = demo_sequence(tok, tasks[0])
    obs = [i for i, t in enumerate(ids) if t == tok.obs_id]
    assert obs and all(mask[i] == 0.0 for i in obs)
    assert mask[ids.index(tok.call_id)] == 1.0

    class ScriptedEngine:               # writes the reference calls turn by turn (a perfect policy)
        def __init__(self):
            self.turn = 0

        def generate(self, prompts, **kw):
            from repro.rollout.engine import AcceptanceCounters, RolloutResult
            toks = []
            for p in prompts:
                task = tasks[0] if tasks[0].instruction in tok.decode(p) else tasks[1]
                calls = task.calls
                done = p.count(tok.call_id)
                t = ([tok.call_id] + tok.encode(calls[done]) + [tok.call_end_id]) if done < len(calls) \
                    else tok.encode("done") + [tok.eos_id]
                toks.append(t)
            return RolloutResult(toks, [[-0.5] * len(t) for t in toks], ["stop"] * len(toks),
                                 AcceptanceCounters(0), 1)
    b = workplace_rollout(ScriptedEngine(), tok, tasks, group_size=1, max_new_tokens=64, temperature=1.0,
                          seed=0, tool_latency_s=0.01, max_tool_calls=3)
    assert b.rewards.tolist() == [1.0, 1.0]
    assert b.tool_time_s >= 0.01
    written = b.loss_mask.bool()
    assert torch.all(b.rollout_logp[written] == -0.5) and torch.all(b.rollout_logp[~written] == 0)
    assert torch.all(b.input_ids[~written & b.attention_mask] != tok.call_id)


@pytest.mark.parametrize("profile", ["cpu-tiny", "h200"])
def test_every_profile_row_is_a_valid_config(profile, tmp_path):
    from repro.core.profile import load_profile
    from repro.core.specs import ARTIFACTS
    from repro.rl.config import artifact_rows
    prof = load_profile(profile)
    for artifact in ARTIFACTS:
        rows = artifact_rows(prof, artifact)
        assert any(not (spec or {}).get("draft") for spec in rows.values()), f"{artifact}: no baseline row"
        for row, spec in rows.items():
            cfg = run_config_from_profile(prof, artifact, row, out=str(tmp_path))
            assert (cfg.draft is None) == (not (spec or {}).get("draft"))
            if spec.get("baseline"):
                assert spec["baseline"] in rows, f"{artifact} {row}: baseline {spec['baseline']!r} is not a row"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a CPU-only machine")
def test_a_gpu_profile_on_a_cpu_machine_fails_before_writing(tmp_path, capsys):
    from repro.rl.run import main as run_main
    out = tmp_path / "run"
    assert run_main(["--artifact", "table1", "--row", "Qwen3-8B/DFlash", "--profile", "h200", "--out", str(out)]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not out.exists()


@pytest.mark.timeout(30)
def test_device_memory_metrics(monkeypatch):
    """On CUDA each step logs the process's memory (allocated, peak, CUDA graph pools); off CUDA nothing."""
    from repro.rl import trainer

    assert trainer.device_memory_metrics() == {} or torch.cuda.is_available()
    cuda = trainer.torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(cuda, "memory_allocated", lambda: 2e9)
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda: 5e9)
    monkeypatch.setattr(cuda, "memory_snapshot", lambda: [{"total_size": 1e9, "segment_pool_id": (0, 0)},
                                                          {"total_size": 3e9, "segment_pool_id": (1, 2)},
                                                          {"total_size": 0.5e9, "segment_pool_id": [0, 7]}])
    assert trainer.device_memory_metrics() == {"train/device_memory_gb": 2.0, "train/device_peak_memory_gb": 5.0,
                                               "train/graph_pool_memory_gb": 3.5}


@pytest.mark.timeout(120)
def test_compiled_frames_since_names_the_frame_and_the_failed_guard():
    from repro.rl.trainer import compiled_frames_since

    def doubled(x):
        return x * 2

    fn = torch.compile(doubled, backend="eager", dynamic=False)
    fn(torch.ones(3))
    start = time.time_ns() // 1000
    assert not any("doubled" in f for f in compiled_frames_since(start))    # compiled before: not named
    fn(torch.ones(5))                                                     # a new static size: recompiled
    found = [f for f in compiled_frames_since(start) if "doubled" in f]
    assert len(found) == 1 and "test_trainer.py" in found[0] and "size mismatch" in found[0]


@pytest.mark.timeout(240)
def test_warm_up_runs_one_rollout_per_request_shape_and_leaves_training_unchanged(tmp_path, tok, monkeypatch):
    """On a static-cache engine, ``warm_up`` rolls out once for each request shape the run's steps will meet (the
    steps' prompts differ in length, so in shape) and nothing of it reaches training: the logged steps equal
    those of a run without it, and its steps build no static state the warm-up did not."""
    def trained(name, warm):
        tr = CoTrainer(tiny_config(tmp_path / name, draft="dspark", steps=4, cuda_graphs="all"), tok)
        calls = []
        prepare = tr.update.prepare
        monkeypatch.setattr(tr.update, "prepare", lambda *a, **kw: calls.append(a) or prepare(*a, **kw))
        shapes = {tr.engine.request_shape(tr.cfg.grpo.rows_per_step,
                                          max(len(chat_prompt(tok, p.prompt_text))
                                              for p in tr.math.problems("train", 2, draw=s)), 10)
                  for s in range(4)}
        ran = tr.warm_up() if warm else 0
        prepared = len(calls)                     # the update's compile (if any) made before the first step
        built = dict(tr.engine.static_decoder.states._states)
        rows = [tr.train_step(s)[0] for s in range(4)]
        return tr, shapes, ran, built, rows, prepared

    from repro.rl.episodes import chat_prompt
    cold, shapes, ran, _, rows_cold, prepared_cold = trained("cold", False)
    warm, shapes_w, ran_w, built, rows_warm, prepared = trained("warm", True)
    assert ran == 0 and len(shapes) >= 2 and ran_w == len(shapes_w) == len(shapes)
    assert (prepared_cold, prepared) == (0, 1)
    for a, b in zip(rows_cold, rows_warm):
        for key in ("train/reward", "train/response_len", "train/policy_loss", "train/acceptance_length"):
            assert a[key] == b[key], key
    assert set(warm.engine.static_decoder.states._states) <= set(built)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("draft", [None, "dspark"])
def test_steps_after_the_warm_up_capture_no_graphs(tmp_path, tok, draft, monkeypatch):
    """Under CPU replay emulation (graphs captured and replayed as on a GPU), a run warmed up by ``warm_up`` captures
    no graph in its steps nor in its validation (greedy, on the held-out problems): the warm-up's rollouts, the
    validation's included, run every step a request can take (``every_step``, whose own test is
    tests/rollout/test_cuda_graphs.py), the steps' do not. Each step logs its own captures
    (``train/step_graph_captures``) beside the process's running count."""
    from repro.decoding.cuda_graph import GraphedCallable
    monkeypatch.setattr(GraphedCallable, "emulate_replay", True)
    cfg = tiny_config(tmp_path, draft=draft, steps=4, cuda_graphs="all")
    cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, max_new_tokens=150))
    tr = CoTrainer(cfg, tok)
    calls, generate = [], tr.engine.generate
    monkeypatch.setattr(tr.engine, "generate",
                        lambda *a, **kw: calls.append(kw.get("every_step")) or generate(*a, **kw))
    ran = tr.warm_up()
    warmed = GraphedCallable.total_captures
    assert calls == [True] * (ran + 1) and ran > 0          # each training request shape, then the validation's
    rows = [tr.train_step(s)[0] for s in range(4)]
    tr.validate(3)
    assert calls[ran + 1:] == [None] * 5
    assert [r["train/step_graph_captures"] for r in rows] == [0] * 4
    assert rows[-1]["train/graph_captures"] == warmed == GraphedCallable.total_captures > 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("draft", [None, "dspark"])
def test_multi_turn_steps_after_the_warm_up_capture_no_graphs_and_train_the_same(tmp_path, tok, draft, monkeypatch):
    """The workplace workload's turns are known only as they run: ``warm_up`` runs ``RolloutEngine.warm_up`` up to
    their bound with the rollouts' settings (sampled, the validation greedy; the two stop tokens), after which,
    under CPU replay emulation with the GPU's prompt padding, neither the steps nor the validation capture a graph;
    a run without it captures in its steps, and trains the same. (This tiny policy ends its episodes in one turn;
    tests/rollout/test_cuda_graphs.py checks later turns: fewer rows, longer prompts, smaller budgets.)"""
    from repro.decoding.cuda_graph import GraphedCallable
    from repro.rollout.static_loop import PROMPT_BUCKET
    monkeypatch.setattr(GraphedCallable, "emulate_replay", True)

    def run(name, warm):
        cfg = tiny_config(tmp_path / name, draft=draft, steps=3, workload="workplace", cuda_graphs="all",
                          bucket_batch=True)
        tr = CoTrainer(cfg, tok)
        tr.engine.static_decoder.prompt_bucket = PROMPT_BUCKET
        ran = tr.warm_up() if warm else 0
        rows = [tr.train_step(s)[0] for s in range(3)]
        n0 = GraphedCallable.total_captures
        tr.validate(2)
        return ran, rows, GraphedCallable.total_captures - n0

    ran, rows, validation = run("warm", True)
    assert ran > 0 and [r["train/step_graph_captures"] for r in rows] == [0] * 3 and validation == 0
    assert sum(r["train/response_len"] for r in rows) > 0
    _, cold, _ = run("cold", False)
    assert sum(r["train/step_graph_captures"] for r in cold) > 0
    for a, b in zip(cold, rows):
        for key in ("train/reward", "train/response_len", "train/gen_tokens", "train/policy_loss"):
            assert a[key] == b[key], key
