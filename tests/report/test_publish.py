"""publish copies this machine's finished artifacts into the reference folder: by default it replaces only those,
keeping the reference's other artifacts, its README and the replaced artifacts' summaries (named by the commit
that measured them); ``--replace`` makes the folder this machine's runs alone; unfinished runs, checkpoints and
weights never travel, and a publish that fails leaves the reference as it was.

    .venv/bin/python -m pytest -q tests/report/test_publish.py
"""
import json

import pytest

from repro.report import publish as pub

pytestmark = pytest.mark.timeout(60)

HW = {"tag": "1xgpu-host", "cpu": {"model": "Host CPU", "usable_cores": 16}, "gpus": {"devices": [{"name": "GPU"}]}}


def run(folder, artifact, sha, finished=True, summary=None, files=()):
    """A run folder as the workflow leaves it: env.json, metrics.jsonl, and any extra files."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {"artifact": artifact, "finished": finished, "git": {"sha": sha * 40, "dirty": False}, "hardware": HW,
           "date": "2026-12-07"}
    (folder / "env.json").write_text(json.dumps(env))
    (folder / "metrics.jsonl").write_text('{"row": "r", "step": 0}\n')
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(name)
    return folder


@pytest.fixture
def reference(tmp_path):
    """A reference folder measured at commit a: table1 (two rows and a summary), fig6 (a bench), logs/ and a README."""
    ref = tmp_path / "reference" / "1xgpu-host" / "h200"
    run(ref / "table1" / "dense_no_draft", "table1", "a")
    run(ref / "table1" / "moe_no_draft", "table1", "a")
    run(ref / "table1" / "summary", "table1", "a", summary={"rollout": 1.0})
    run(ref / "fig6", "fig6", "a", files=("bench.json",))
    (ref / "logs").mkdir()
    (ref / "logs" / "fig6.snakemake.log").write_text("log")
    (ref / "README.md").write_text("hand-written\n")
    return ref


def test_merge_replaces_only_the_artifacts_finished_here(tmp_path, reference, capsys):
    runs = tmp_path / "results" / "1xgpu-host" / "h200"
    run(runs / "table1" / "dense_no_draft", "table1", "b", files=("ckpt/state.pt", "wandb/run.wandb", "note.txt"))
    run(runs / "table1" / "moe_no_draft", "table1", "b")
    run(runs / "table1" / "summary", "table1", "b", summary={"rollout": 2.0})
    (runs / "table1" / "lockstep_dense.log").write_text("job log")
    run(runs / "table1" / "half_done", "table1", "b", finished=False)
    (runs / "sft" / "dense").mkdir(parents=True)
    (runs / "sft" / "dense" / "policy.pt").write_text("weights")           # no run folder: not an artifact

    got = pub.publish(runs, reference)
    assert set(got) == {"table1"}
    t1 = reference / "table1"
    assert json.loads((t1 / "summary" / "summary.json").read_text()) == {"rollout": 2.0}
    assert json.loads((t1 / "dense_no_draft" / "env.json").read_text())["git"]["sha"].startswith("b")
    assert (t1 / "lockstep_dense.log").read_text() == "job log" and (t1 / "dense_no_draft" / "note.txt").exists()
    assert not (t1 / "half_done").exists() and not (t1 / "dense_no_draft" / "ckpt").exists()
    assert not (t1 / "dense_no_draft" / "wandb").exists() and not (reference / "sft").exists()
    # the other artifact, the logs and the hand-written README stay; the replaced summary is kept, named by commit a
    assert (reference / "fig6" / "bench.json").read_text() == "bench.json"
    assert (reference / "logs" / "fig6.snakemake.log").exists()
    assert json.loads((reference / "logs" / "table1-aaaaaaa.summary.json").read_text()) == {"rollout": 1.0}
    assert (reference / "README.md").read_text() == "hand-written\n"
    assert "README.md kept" in capsys.readouterr().err
    assert not list(reference.parent.glob(".h200*"))                    # no stage or old copy left beside it


def test_merge_names_the_reference_runs_it_drops(tmp_path, reference, capsys):
    runs = tmp_path / "results" / "1xgpu-host" / "h200"
    run(runs / "table1" / "dense_no_draft", "table1", "b")
    pub.publish(runs, reference)
    assert not (reference / "table1" / "moe_no_draft").exists()
    assert "moe_no_draft" in capsys.readouterr().err


def test_a_bench_artifact_keeps_its_bench_and_the_same_commit_keeps_nothing(tmp_path, reference):
    runs = tmp_path / "results" / "1xgpu-host" / "h200"
    run(runs / "fig6", "fig6", "c", files=("bench.json",))
    pub.publish(runs, reference)
    assert (reference / "logs" / "fig6-aaaaaaa.bench.json").read_text() == "bench.json"
    before = sorted(p.name for p in (reference / "logs").iterdir())
    pub.publish(runs, reference)                                         # the same runs again: nothing new kept
    assert sorted(p.name for p in (reference / "logs").iterdir()) == before


def test_replace_makes_the_folder_this_machines_runs_alone(tmp_path, reference):
    runs = tmp_path / "results" / "1xgpu-host" / "h200"
    run(runs / "fig6", "fig6", "b", files=("bench.json",))
    assert pub.main(["--runs", str(runs), "--out", str(reference), "--replace"]) == 0
    assert sorted(p.name for p in reference.iterdir()) == ["README.md", "fig6"]
    text = (reference / "README.md").read_text()
    assert "`bbbbbbbbbb` (1 run)" in text and "1x GPU" in text and "profile=h200" in text


def test_the_readme_it_wrote_follows_the_folder_and_one_edited_by_hand_stays(tmp_path):
    runs, out = tmp_path / "results" / "hw" / "cpu-tiny", tmp_path / "reference" / "hw" / "cpu-tiny"
    run(runs / "table1" / "row", "table1", "d")
    pub.publish(runs, out)
    assert "snakemake -c all table1 --config profile=cpu-tiny" in (out / "README.md").read_text()
    run(runs / "fig6", "fig6", "e", files=("bench.json",))
    pub.publish(runs, out)                                  # the written README now names both artifacts
    text = (out / "README.md").read_text()
    assert "snakemake -c all table1 fig6 --config profile=cpu-tiny" in text and "`eeeeeeeeee` (1 run)" in text
    (out / "README.md").write_text(text + "A note by hand.\n")
    pub.publish(runs, out)
    assert (out / "README.md").read_text().endswith("A note by hand.\n")


def test_nothing_finished_is_an_error_and_leaves_the_reference(tmp_path, reference, capsys):
    runs = tmp_path / "results" / "1xgpu-host" / "h200"
    run(runs / "table1" / "row", "table1", "b", finished=False)
    before = sorted(str(p.relative_to(reference)) for p in reference.rglob("*"))
    assert pub.main(["--runs", str(runs), "--out", str(reference)]) == 2
    assert "no finished run folder" in capsys.readouterr().err
    assert sorted(str(p.relative_to(reference)) for p in reference.rglob("*")) == before


def test_a_failed_copy_leaves_the_reference_as_it_was(tmp_path, reference, monkeypatch):
    runs = tmp_path / "results" / "1xgpu-host" / "h200"
    run(runs / "table1" / "dense_no_draft", "table1", "b")
    before = {str(p.relative_to(reference)): p.read_bytes() for p in reference.rglob("*") if p.is_file()}

    def broken(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(pub, "_copy_artifact", broken)
    with pytest.raises(OSError, match="disk full"):
        pub.publish(runs, reference)
    assert {str(p.relative_to(reference)): p.read_bytes() for p in reference.rglob("*") if p.is_file()} == before
    assert not list(reference.parent.glob(".h200*"))


def test_sft_warm_starts_publish_as_an_artifact_without_their_weights(tmp_path, reference):
    """An SFT warm start has no env.json: sft.json, its job's last write, marks it finished. The finished one travels
    (sft.json, tokenizer, the job's log) without its weights; one that began (tokenizer/) but did not finish stays."""
    runs = tmp_path / "results" / "1xgpu-host" / "h200"
    done, begun = runs / "sft" / "dense-math", runs / "sft" / "moe-math"
    for folder in (done, begun):
        (folder / "tokenizer").mkdir(parents=True)
        (folder / "tokenizer" / "tokenizer.json").write_text("{}")
    (done / "drafts").mkdir()
    (done / "drafts" / "dflash.pt").write_text("weights")
    (done / "policy.pt").write_text("weights")
    (done / "sft.json").write_text(json.dumps({"sft_loss_last": 0.5, "provenance": {
        "git": {"sha": "b" * 40}, "hardware": HW, "date": "2026-12-07"}}))
    (runs / "sft" / "dense-math.log").write_text("job log")

    (reference / "README.md").unlink()                 # a README written here names the warm starts too
    assert pub.publish(runs, reference) == {"sft": [done]}
    assert "| sft | 1 |" in (reference / "README.md").read_text()
    sft = reference / "sft"
    assert sorted(p.relative_to(sft).as_posix() for p in sft.rglob("*") if p.is_file()) == [
        "dense-math.log", "dense-math/sft.json", "dense-math/tokenizer/tokenizer.json"]
    assert (reference / "table1" / "summary" / "summary.json").exists()        # the other artifacts stay
