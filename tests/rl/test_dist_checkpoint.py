"""The distributed run's checkpoint files (repro.rl.dist_checkpoint): a step counts only once rank 0 commits it, a
commit removes the older steps, and a checkpoint that must not be continued is refused (another config or layout,
a rank's file missing) or dropped (another warm start, or another config with restart_on_config_change).

    .venv/bin/python -m pytest -q tests/rl/test_dist_checkpoint.py
"""
import pytest
import torch

from repro.core.specs import ConfigError
from repro.rl.dist_checkpoint import ROOT, commit, drop, load_rank, resumable_step, save_rank

LAYOUT = {"pp": 2, "cp": 1, "world": 2}
CONFIG = {"row": "r", "steps": 8, "out": "/x", "workload": {"math_ops": (4, 6)}, "seed": 0}


def save_step(out, step, ranks=(0, 1)):
    for r in ranks:
        save_rank(out, step, r, {"weights": torch.full((3,), float(10 * step + r))})


def test_a_step_counts_once_committed_and_the_commit_removes_older_steps(tmp_path):
    save_step(tmp_path, 1)
    assert resumable_step(tmp_path, LAYOUT, CONFIG, "d") is None, "saved but not committed: nothing to continue"
    commit(tmp_path, 1, LAYOUT, CONFIG, "d")
    save_step(tmp_path, 3)                       # the next checkpoint, cut off before its commit
    assert resumable_step(tmp_path, LAYOUT, {**CONFIG, "steps": 12, "out": "/y"}, "d") == 1   # steps, out may change
    commit(tmp_path, 3, LAYOUT, CONFIG, "d")
    assert sorted(p.name for p in (tmp_path / ROOT).iterdir()) == ["latest.json", "step3"]
    torch.manual_seed(5)
    save_rank(tmp_path, 5, 1, {"weights": torch.zeros(1)})
    want = torch.rand(4)                          # the RNG as it was when rank 1 saved step 5
    torch.manual_seed(0)
    assert load_rank(tmp_path, 3, 1)["weights"].tolist() == [31.0] * 3
    load_rank(tmp_path, 5, 1)
    assert torch.equal(torch.rand(4), want)
    drop(tmp_path)
    assert not (tmp_path / ROOT).exists()


def test_a_checkpoint_that_must_not_be_continued_is_refused_or_dropped(tmp_path, capsys):
    save_step(tmp_path, 2)
    commit(tmp_path, 2, LAYOUT, CONFIG, "d")
    with pytest.raises(ConfigError, match=r"first differing key 'seed': 0 vs 1"):
        resumable_step(tmp_path, LAYOUT, {**CONFIG, "seed": 1}, "d")
    with pytest.raises(ConfigError, match=r"written by layout \{'pp': 2, 'cp': 1, 'world': 2\}, this run is"):
        resumable_step(tmp_path, {"pp": 1, "cp": 2, "world": 2}, CONFIG, "d")
    (tmp_path / ROOT / "step2" / "rank1.pt").unlink()
    with pytest.raises(ConfigError, match=r"files of ranks \[1\] are missing"):
        resumable_step(tmp_path, LAYOUT, CONFIG, "d")
    save_step(tmp_path, 2)
    assert resumable_step(tmp_path, LAYOUT, {**CONFIG, "seed": 1}, "d", restart_on_config_change=True) is None
    assert "of another config (key 'seed' changed)" in capsys.readouterr().err
    assert not (tmp_path / ROOT).exists()
    save_step(tmp_path, 2)
    commit(tmp_path, 2, LAYOUT, CONFIG, "d")
    assert resumable_step(tmp_path, LAYOUT, CONFIG, "another warm start") is None
    assert "from another warm start" in capsys.readouterr().err and not (tmp_path / ROOT).exists()
