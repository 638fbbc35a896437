"""repro.rl.lockstep: rows trained in one process with their steps interleaved give each row exactly the values of
its separate ``repro.rl.run`` (only the timings may differ), write the same run folders, and refuse bad input."""
import json
import signal

import pytest
import torch
import yaml

from repro.core.layout import replica_run_name, run_dir_name
from repro.core.profile import load_profile
from repro.rl import lockstep, run

ROWS = ["Qwen3-8B/no draft", "Qwen3-8B/DFlash"]


@pytest.fixture()
def profile_file(tmp_path):
    prof = load_profile("cpu-tiny")
    prof["table1"]["steps"] = 2
    prof["rl"]["grpo"] = {**prof["rl"]["grpo"], "prompts_per_step": 2, "generations_per_prompt": 2,
                          "max_new_tokens": 12}
    prof["rl"]["workload"] = {**prof["rl"].get("workload", {}), "val_size": 2}
    p = tmp_path / "profile.yaml"
    p.write_text(yaml.safe_dump(prof, sort_keys=False))
    return p


def _values(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timing = ("_s", "_tok_s", "time")
    return [{k: v for k, v in r.items() if not any(k.endswith(t) or t in k for t in timing)} for r in rows]


@pytest.fixture()
def varied_rewards(monkeypatch):
    """A random tiny policy never solves a problem, so every advantage would be 0 and the policy never move: score
    responses by a deterministic function of their text instead, so the policy updates are compared too."""
    from repro.rl import episodes
    monkeypatch.setattr(episodes, "dapo_reward", lambda text, answer: float(len(text) % 3 == 0))


@pytest.mark.timeout(600)
def test_lockstep_rows_equal_their_separate_runs(tmp_path, profile_file, varied_rewards):
    # the rows, and the baseline's sampling-seed replica (baseline_seeds), each alone and then in one lockstep process
    replica = replica_run_name(run_dir_name(ROWS[0]), 1)
    for row in ROWS:
        assert run.main(["--artifact", "table1", "--row", row, "--profile", str(profile_file),
                         "--out", str(tmp_path / "alone" / run_dir_name(row))]) == 0
    assert run.main(["--artifact", "table1", "--row", ROWS[0], "--profile", str(profile_file), "--sampling-seed", "1",
                     "--out", str(tmp_path / "alone" / replica)]) == 0
    record = tmp_path / "lockstep_dense.json"
    entries = ROWS + [f"{ROWS[0]}@1"]
    assert lockstep.main(["--artifact", "table1", "--rows", ",".join(entries), "--profile", str(profile_file),
                          "--out-root", str(tmp_path / "lockstep"), "--record", str(record)]) == 0
    names = [run_dir_name(r) for r in ROWS] + [replica]
    assert json.loads(record.read_text())["rows"] == entries
    assert sorted(json.loads(record.read_text())["runs"]) == sorted(names)
    for name, row in zip(names, ROWS + ROWS[:1]):
        alone, together = tmp_path / "alone" / name, tmp_path / "lockstep" / name
        a, b = _values(alone), _values(together)
        assert len(a) == len(b) == 2 and a == b, name
        assert any(r["train/policy_grad_norm"] > 0 for r in a), name         # the policy did move
        rec = json.loads((together / "run.json").read_text())
        assert rec["row"] == row and rec["lockstep_rows"] == entries and rec["last"] is not None
    # the replica sampled differently from the row it replicates (same prompts, another sampling seed)
    assert _values(tmp_path / "alone" / replica) != _values(tmp_path / "alone" / names[0])


@pytest.mark.timeout(600)
def test_lockstep_rows_on_static_caches_share_one_policy_cache(tmp_path, profile_file, varied_rewards, monkeypatch):
    """With the rollouts on static caches (``rl.rollout.cuda_graphs: all``), the lockstep's rows take their policy
    caches from one SharedKVStorage: one buffer under every row's cache, and each row's values still equal its
    separate run's."""
    from repro.decoding.policy_cache import SharedKVStorage

    prof = yaml.safe_load(profile_file.read_text())
    prof["rl"]["rollout"] = {**prof["rl"].get("rollout", {}), "cuda_graphs": "all"}
    profile_file.write_text(yaml.safe_dump(prof, sort_keys=False))
    storages = []
    real_init = SharedKVStorage.__init__
    monkeypatch.setattr(SharedKVStorage, "__init__", lambda self: real_init(self) or storages.append(self))
    for row in ROWS:
        assert run.main(["--artifact", "table1", "--row", row, "--profile", str(profile_file),
                         "--out", str(tmp_path / "alone" / run_dir_name(row))]) == 0
    assert storages == []                                     # a run of its own shares nothing
    assert lockstep.main(["--artifact", "table1", "--rows", ",".join(ROWS), "--profile", str(profile_file),
                          "--out-root", str(tmp_path / "lockstep")]) == 0
    assert len(storages) == 1 and storages[0].nbytes() > 0
    for row in ROWS:
        a, b = _values(tmp_path / "alone" / run_dir_name(row)), _values(tmp_path / "lockstep" / run_dir_name(row))
        assert len(a) == 2 and a == b, row


@pytest.mark.parametrize("entry", ["no draft@x", "no draft@", "@1", "no draft@-1"])
def test_bad_replica_entries_are_refused(tmp_path, profile_file, capsys, entry):
    with pytest.raises(SystemExit):
        lockstep.main(["--artifact", "table1", "--rows", entry, "--profile", str(profile_file),
                       "--out-root", str(tmp_path / "out")])
    assert f"--rows entry {entry!r} is invalid" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_rotated_order():
    assert [lockstep.rotated([1, 2, 3], k) for k in range(4)] == [[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 2, 3]]


def test_bad_rows_fail_before_training(tmp_path, profile_file, capsys):
    assert lockstep.main(["--artifact", "table1", "--rows", "Qwen3-8B/no draft,nope", "--profile",
                          str(profile_file), "--out-root", str(tmp_path / "x")]) == 2
    assert "row='nope' is invalid" in capsys.readouterr().err
    assert not list((tmp_path / "x").rglob("metrics.jsonl"))
    with pytest.raises(SystemExit):
        lockstep.main(["--artifact", "table1", "--rows", " , ", "--out-root", str(tmp_path / "y")])


@pytest.mark.timeout(600)
def test_a_crashed_lockstep_job_resumes_every_row_without_losing_steps(tmp_path, profile_file, monkeypatch,
                                                                     varied_rewards):
    prof = yaml.safe_load(profile_file.read_text())
    prof["table1"].update(steps=3, ckpt_every=1)
    profile_file.write_text(yaml.safe_dump(prof, sort_keys=False))
    args = ["--artifact", "table1", "--rows", ",".join(ROWS), "--profile", str(profile_file)]
    assert lockstep.main(args + ["--out-root", str(tmp_path / "whole")]) == 0
    for row in ROWS:             # finished runs keep no checkpoint (several GB each at one-GPU scale)
        assert (tmp_path / "whole" / run_dir_name(row) / "run.json").is_file()
        assert not (tmp_path / "whole" / run_dir_name(row) / "ckpt" / "latest.pt").exists(), row

    real_step = run.CoTrainer.run_step

    def crash_at_drafted_step_2(self, step, logger, on_step=None):
        if step == 2 and self.cfg.draft is not None:
            raise RuntimeError("simulated crash")
        return real_step(self, step, logger, on_step)

    monkeypatch.setattr(run.CoTrainer, "run_step", crash_at_drafted_step_2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        lockstep.main(args + ["--out-root", str(tmp_path / "crashed")])
    assert not (tmp_path / "crashed" / run_dir_name(ROWS[1]) / "run.json").exists()
    monkeypatch.setattr(run.CoTrainer, "run_step", real_step)
    _continues_to_the_whole_run(args, tmp_path / "whole", tmp_path / "crashed")


def _continues_to_the_whole_run(args, whole, out):
    """The same lockstep command again finishes every row with exactly the values of the run never stopped."""
    assert lockstep.main(args + ["--out-root", str(out)]) == 0
    for row in ROWS:
        resumed = _values(out / run_dir_name(row))
        assert [r["step"] for r in resumed] == [0, 1, 2] and resumed == _values(whole / run_dir_name(row)), row
        assert (out / run_dir_name(row) / "run.json").is_file(), row


def _signal_on_call(monkeypatch, n: int, signum: int):
    """The n-th row step of the process gets ``signum`` while it runs (as Ctrl-C or a scheduler would send it);
    returns the unpatched step."""
    real_step, calls = run.CoTrainer.run_step, []

    def step_with_signal(self, step, logger, on_step=None):
        calls.append(step)
        if len(calls) == n:
            signal.raise_signal(signum)
        return real_step(self, step, logger, on_step)

    monkeypatch.setattr(run.CoTrainer, "run_step", step_with_signal)
    return real_step


def _checkpointed_step(run_dir) -> int:
    return torch.load(run_dir / "ckpt" / "latest.pt", weights_only=False)["step"]


@pytest.mark.timeout(600)
def test_a_signalled_lockstep_stops_at_a_step_boundary_and_continues(tmp_path, profile_file, monkeypatch,
                                                                    varied_rewards):
    """SIGINT mid-run (Ctrl-C, ``timeout``): the row step in flight finishes, every row is checkpointed after its
    last finished step although the profile writes no periodic checkpoint, the process returns 130 without run
    records, and the same command continues to exactly the values of a run never stopped."""
    prof = yaml.safe_load(profile_file.read_text())
    prof["table1"].update(steps=3, ckpt_every=0)
    profile_file.write_text(yaml.safe_dump(prof, sort_keys=False))
    args = ["--artifact", "table1", "--rows", ",".join(ROWS), "--profile", str(profile_file)]
    assert lockstep.main(args + ["--out-root", str(tmp_path / "whole")]) == 0

    handler = signal.getsignal(signal.SIGINT)
    real_step = _signal_on_call(monkeypatch, 3, signal.SIGINT)  # during ROWS[1]'s step 1 (first in step 1's rotation)
    assert lockstep.main(args + ["--out-root", str(tmp_path / "stopped")]) == 128 + signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is handler
    for row, last in zip(ROWS, (0, 1)):
        folder = tmp_path / "stopped" / run_dir_name(row)
        assert not (folder / "run.json").exists(), row
        assert [r["step"] for r in _values(folder)] == list(range(last + 1)), row
        assert _checkpointed_step(folder) == last, row
    monkeypatch.setattr(run.CoTrainer, "run_step", real_step)
    _continues_to_the_whole_run(args, tmp_path / "whole", tmp_path / "stopped")


@pytest.mark.timeout(600)
def test_a_signalled_run_stops_at_a_step_boundary_and_continues(tmp_path, profile_file, monkeypatch,
                                                              varied_rewards):
    """The same for one row's ``repro.rl.run`` under SIGTERM (a scheduler's preemption notice): 143, a checkpoint
    after step 0, then the uninterrupted values."""
    prof = yaml.safe_load(profile_file.read_text())
    prof["table1"].update(steps=2, ckpt_every=0)
    profile_file.write_text(yaml.safe_dump(prof, sort_keys=False))
    args = ["--artifact", "table1", "--row", ROWS[1], "--profile", str(profile_file)]
    assert run.main(args + ["--out", str(tmp_path / "whole")]) == 0
    real_step = _signal_on_call(monkeypatch, 1, signal.SIGTERM)
    assert run.main(args + ["--out", str(tmp_path / "stopped")]) == 128 + signal.SIGTERM
    assert not (tmp_path / "stopped" / "run.json").exists()
    assert _checkpointed_step(tmp_path / "stopped") == 0
    monkeypatch.setattr(run.CoTrainer, "run_step", real_step)
    assert run.main(args + ["--out", str(tmp_path / "stopped")]) == 0
    assert _values(tmp_path / "stopped") == _values(tmp_path / "whole")
