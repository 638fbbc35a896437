"""The draft sweep report (studies.draft_controls.report) on two synthetic sweep.json files, one with the newer
fields and one old-style; a missing or malformed input exits 2 naming the file and writes nothing.

    .venv/bin/python -m pytest -q studies/draft_controls/test_report.py
"""
import json

import pytest

from studies.draft_controls.report import main

pytestmark = pytest.mark.timeout(60)

PROV = {"hardware": {"tag": "cpu-2c", "label": "cpu-emulated"}, "git": {"sha": "abc1234def5678", "dirty": False},
        "date": "2026-01-01T00:00:00+00:00", "config": {"profile": "cpu-tiny", "artifact": "fig3"}}
AL = {("EAGLE-3", 0): [2.0, 2.5, 2.0, 3.0, 3.0, 4.0],   # last 4: (2+3+3+4)/4 = 3.0
      ("EAGLE-3", 1): [2.0, 2.0, 3.0, 3.0, 4.0, 4.0],   # last 4: 3.5
      ("DFlash", 0): [1.0, 1.5, 1.5, 1.5, 1.5, 1.5],    # last 4: 1.5
      ("DFlash", 1): [1.0, 1.0, 1.0, 1.0, 1.0, 2.0]}    # last 4: 1.25


def _sweep(path, new_fields: bool):
    runs = []
    for (row, lw), al in AL.items():
        run = {"row": row, "loss_weight": lw, "acceptance_length": al, "draft_loss": [2.0, None, 1.0, 1, 1, 0.5],
               "reward": [0.0, 0.5] * 3, "mean_acceptance_length": sum(al) / len(al), "first_update_al_ratio": 1}
        if new_fields:
            run |= {"rollout_time_s": [9.0, 1.0, 2.0, 3.0, 4.0, 5.0], "val_accuracy": [[0, 0.25], [5, 0.75]]}
        runs.append(run)
    sweep = {"key": "loss_weight", "runs": runs, "provenance": PROV}
    if new_fields:
        sweep["complete"] = True
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(sweep))
    return str(path)


def test_report_of_two_sweeps(tmp_path):
    new, old = _sweep(tmp_path / "fig3" / "sweep.json", True), _sweep(tmp_path / "fig4" / "sweep.json", False)
    assert main([new, old, "--out-dir", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "fig3.md").read_text()                     # NAME: the first input's folder
    lines = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(lines) == 2 * (1 + len(AL))                                # header + one line per (row, value)
    assert md.count("## ") == 2 and new in md and old in md
    assert "cpu-2c (cpu-emulated)" in md and "abc1234def56" in md and "2026-01-01" in md
    eagle1 = next(line for line in lines if line.startswith("| EAGLE-3 | 1 |")).split(" | ")
    assert eagle1[2:7] == ["2.000", "2.000", "3.000", "3.500", "4.000"]  # step 0, 1, mean, last 4, final
    low, high = (float(v) for v in eagle1[7].split("[")[1].rstrip("]").split(","))
    assert eagle1[7].startswith("+0.4571 [") and 0 < low <= 0.4571 <= high  # least squares: 8 / 17.5 per step
    assert eagle1[8:12] == ["2.000 -> 0.500", "0.250", "0.750", "3.00 |"]  # rollout: mean of steps >= 1
    assert lines[-1].endswith("| - | - |")                                # old-style: no val accuracy, rollout
    assert md.count("- difference, EAGLE-3: AL last 4, loss_weight=1 minus loss_weight=0: +0.500") == 2
    assert md.count("- difference, DFlash: AL last 4, loss_weight=1 minus loss_weight=0: -0.250") == 2
    assert (tmp_path / "out" / "fig3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((tmp_path / "out" / "fig3.json").read_text())
    assert [len(i["table"]) for i in report["inputs"]] == [4, 4]
    assert report["inputs"][0]["table"][1]["al_last4"] == 3.5
    assert report["inputs"][1]["complete"] is None and report["inputs"][0]["provenance"] == PROV
    assert "git" in report["provenance"] and report["provenance"]["config"]["name"] == "fig3"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["fig3.json", "fig3.md", "fig3.png"]


@pytest.mark.parametrize("content", [None, "{not json", json.dumps({"key": "lr"}), json.dumps({"runs": [{}]})])
def test_bad_input_exits_2_naming_the_file(tmp_path, capsys, content):
    good = _sweep(tmp_path / "ok" / "sweep.json", True)
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    assert main([good, str(bad), "--out-dir", str(tmp_path / "out"), "--name", "r"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "expected" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def _arm(path, key, value, al_by_row, warm_start="/tmp/sft"):
    """A one-value sweep.json of an arm of scripts/device/shared_warmstart.sh."""
    config = {"profile": "h200", "artifact": "fig4", "warm_start": warm_start, "seed": 0, "steps": 0}
    runs = [{"row": row, key: value, "acceptance_length": al, "draft_loss": [1.0, 0.5]}
            for row, al in al_by_row.items()]
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": key, "complete": True, "runs": runs, "provenance": {**PROV, "config": config}}))
    return str(path)


def test_merge_compares_arms_of_one_warm_start_against_the_first(tmp_path):
    frozen = _arm(tmp_path / "lw0" / "sweep.json", "loss_weight", 0.0, {"DFlash": [3, 3, 3, 3], "DSpark": [5, 5, 5, 5]})
    low = _arm(tmp_path / "lr1" / "sweep.json", "lr", 5e-5, {"DFlash": [3, 4, 4, 5], "DSpark": [5, 5, 4, 4]})
    assert main(["--merge", frozen, low, "--out-dir", str(tmp_path / "out"), "--name", "arms"]) == 0
    md = (tmp_path / "out" / "arms.md").read_text()
    assert md.count("## ") == 1 and "draft settings loss_weight=0.0, lr=5e-05, from one warm start" in md
    assert next(line for line in md.splitlines() if line.startswith("## ")).endswith(": lw0, lr1")
    lines = [line for line in md.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[:2] for line in lines[1:]] == [["| DFlash", "loss_weight=0.0"],
                                                             ["| DSpark", "loss_weight=0.0"],
                                                             ["| DFlash", "lr=5e-05"], ["| DSpark", "lr=5e-05"]]
    assert "- DFlash, lr=5e-05 minus loss_weight=0.0: AL last 4 +1.000, AL mean +1.000" in md
    assert "- DSpark, lr=5e-05 minus loss_weight=0.0: AL last 4 -0.500, AL mean -0.500" in md
    report = json.loads((tmp_path / "out" / "arms.json").read_text())
    assert report["provenance"]["config"]["merge"] is True and len(report["inputs"][0]["differences"]) == 2


def test_merge_refuses_sweeps_of_different_warm_starts(tmp_path, capsys):
    a = _arm(tmp_path / "a" / "sweep.json", "loss_weight", 0.0, {"DFlash": [3, 3]})
    b = _arm(tmp_path / "b" / "sweep.json", "lr", 5e-5, {"DFlash": [3, 4]}, warm_start="/tmp/other_sft")
    assert main(["--merge", a, b, "--out-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert b in err and "warm_start is '/tmp/other_sft', expected '/tmp/sft'" in err
    assert not (tmp_path / "out").exists()
