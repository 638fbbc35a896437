"""The in-process update overhead (repro.rl.update_ab) and the run's A/B probe rows (repro.rl.run.log_ab_probe).

    .venv/bin/python -m pytest -q tests/rl/test_update_ab.py
"""
import pytest

from repro.rl.run import log_ab_probe
from repro.rl.trainer import CoTrainer
from repro.rl.update_ab import interleaved_update_ab
from tests.rl.conftest import tiny_config


class Logged(list):
    def log(self, m, *, row="", step=None):
        self.append((row, step, dict(m)))


@pytest.mark.timeout(120)
def test_ab_probe_logs_one_row_per_round_after_training(tmp_path, tok):
    tr = CoTrainer(tiny_config(tmp_path / "d", draft="dspark", steps=1), tok)
    logged = Logged()
    res = log_ab_probe(tr, logged, "DSpark", rounds=3, first_step=5)
    assert [(r, s) for r, s, _ in logged] == [("DSpark", 5), ("DSpark", 6), ("DSpark", 7)]
    for _, _, m in logged:
        assert set(m) == {"ab/update_no_draft_s", "ab/update_drafted_s"} and min(m.values()) > 0
    assert len(res["ratios"]) == 3 and res["overhead_pct"] == pytest.approx(100 * (sorted(res["ratios"])[1] - 1))


def test_ab_needs_a_draft_and_rounds(tmp_path, tok):
    base = CoTrainer(tiny_config(tmp_path / "b", steps=1), tok)
    with pytest.raises(ValueError, match="co-training trainer"):
        interleaved_update_ab(base, None, None, 2)
    drafted = CoTrainer(tiny_config(tmp_path / "d", draft="dflash", steps=1), tok)
    with pytest.raises(ValueError, match="rounds"):
        interleaved_update_ab(drafted, None, None, 0)
