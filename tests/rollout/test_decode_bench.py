"""The decode benchmark program: its CLI and a deadline that skips points but still writes bench.json.

    .venv/bin/python -m pytest -q tests/rollout/test_decode_bench.py
"""
import json

import pytest

from repro.bench import decode


def test_help_and_bad_arguments(capsys):
    with pytest.raises(SystemExit) as e:
        decode.main(["--help"])
    assert e.value.code == 0 and "--profile" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"--families \['medusa'\]"):
        decode.main(["--families", "medusa"])
    with pytest.raises(Exception, match="unknown profile 'tpu'"):
        decode.main(["--profile", "tpu", "--out", "/tmp/never"])


@pytest.mark.timeout(120)
def test_deadline_skips_points_and_writes_bench_json(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    tiny = dict(pretrain_steps=2, train_prompts=4, sample_tokens=4, train_steps=1, new_tokens=4,
                batch_sizes=(1, 2), repeats=1, families=("dspark",))
    decode.run("cpu-tiny", tmp_path, tiny, deadline_s=0.0)
    bench = json.loads((tmp_path / "bench.json").read_text())
    rows = [r["row"] for r in bench["records"]]
    assert rows[:3] == ["pretrain", "sample", "train/dspark"] and "identity/dspark" in rows
    assert not any(r.startswith("plain/") for r in rows)
    assert bench["config"]["skipped_for_deadline"] == ["b1", "b2", "dspark/greedy"]
