"""The CLI: --list and --dry-run print the full launch command of every row; everything a row needs
(checkout and its co-training stack, checkpoints, datasets, GPUs) fails before any launch with a
message naming it. The NeMo-RL checkout is a stand-in rebuilt from the recorded skeleton
(fake_checkout.py); nothing here imports or runs NeMo-RL.

    .venv/bin/python -m pytest -q tests/integrations/nemo_rl/test_nemo_rl_cli.py
"""
from __future__ import annotations

import shlex

import pytest
from fake_checkout import fake_uv, make_checkout, make_data

from integrations.nemo_rl import checks
from integrations.nemo_rl.config import Paths
from integrations.nemo_rl.rows import load_rows, resolve
from integrations.nemo_rl.run import main, run_slug
from repro.core.profile import load_profile

pytestmark = pytest.mark.timeout(120)

PROFILES = ("paper-h100", "paper-gb200")


def n_rows() -> int:
    return sum(len(rows) for p in PROFILES for rows in load_rows(load_profile(p)).values())


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A stand-in checkout with the whole co-training stack, every file both profiles name, and a ``uv``
    on PATH that runs the checkout's (stand-in) config check with this venv's Python."""
    import os
    root = tmp_path_factory.mktemp("world")
    data = {p: make_data(root / p, load_profile(p)) for p in PROFILES}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{fake_uv(root / 'bin')}{os.pathsep}{os.environ['PATH']}")
        yield {"nemo": make_checkout(root / "RL"), "data": data, "root": root}


def argv(world, profile, artifact, row, out, *extra, nemo=None, data=None):
    d = data or world["data"][profile]
    return ["--profile", profile, "--artifact", artifact, "--row", row, "--out", str(out),
            "--nemo-rl-dir", str(nemo or world["nemo"]), "--checkpoint-root", str(d["checkpoint_root"]),
            "--hf-home", str(d["hf_home"]), "--dataset-root", str(d["dataset_root"]), *extra]


def test_list_prints_every_row_with_its_command(capsys):
    assert main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    heads, cmds = lines[0::2], lines[1::2]
    assert len(heads) == len(cmds) == n_rows() == 24
    for head, cmd in zip(heads, cmds):
        assert head.startswith("[paper-") and "TP/PP/CP/EP" in head
        assert "uv run python examples/" in cmd and "nemo_rl_config.yaml" in cmd
        shlex.split(cmd)                                   # one well-formed shell line
        assert ("sbatch --nodes=" in cmd) == ("on 1x" not in head)


def test_dry_run_every_row(world, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    for profile in PROFILES:
        for artifact, rows in load_rows(load_profile(profile)).items():
            for row, spec in rows.items():
                out = world["root"] / "results" / profile / artifact / run_slug(row)
                assert main(argv(world, profile, artifact, row, out, "--dry-run")) == 0, row
                printed = capsys.readouterr().out.splitlines()
                cmd = printed[-1]
                assert printed[0] == f"# {out / 'nemo_rl_config.yaml'}" and (out / "nemo_rl_config.yaml").is_file()
                assert f"uv run python {spec.workload.entry} --config {out / 'nemo_rl_config.yaml'}" in cmd
                assert f"WANDB_DIR={out}" in cmd and f"cd {world['nemo']}" in cmd
                assert not (out / "env.json").exists()      # a dry run leaves no run for collect to find
                if spec.layout.nodes > 1:
                    assert f"sbatch --nodes={spec.layout.nodes} --gres=gpu:4" in cmd and cmd.endswith("ray.sub")


def test_ray_sub_command(world, capsys, tmp_path):
    out = tmp_path / "run"
    assert main(argv(world, "paper-gb200", "table1", "Qwen3.5-122B-A10B/DFlash", out, "--dry-run",
                     "--container", "nvcr.io/nemo-rl:x", "--slurm-account", "acct", "--slurm-partition", "batch")) == 0
    words = shlex.split(capsys.readouterr().out.splitlines()[-1])
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-") and w.split("=")[0].isupper())
    sbatch = words[words.index("sbatch"):]
    assert sbatch == ["sbatch", "--nodes=8", "--gres=gpu:4", "--account=acct", "--partition=batch",
                      "--time=4:00:00", "--job-name=repro-table1-Qwen3.5-122B-A10B_DFlash", "--wait", "ray.sub"]
    assert env["CONTAINER"] == "nvcr.io/nemo-rl:x" and env["GPUS_PER_NODE"] == "4"
    assert "examples/run_grpo.py --config" in env["COMMAND"] and "integrations.nemo_rl.runtime_env" in env["COMMAND"]
    mounts = {m.split(":")[0] for m in env["MOUNTS"].split(",")}
    assert {str(world["nemo"]), str(world["data"]["paper-gb200"]["checkpoint_root"]), str(out)} <= mounts


def test_missing_checkout_and_checkpoint_fail_before_launch(world, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NEMO_RL_DIR", raising=False)
    out = tmp_path / "run"
    args = argv(world, "paper-h100", "table1", "Qwen3-8B/DFlash", out, "--dry-run")
    no_nemo = [a for i, a in enumerate(args) if a != "--nemo-rl-dir" and args[i - 1] != "--nemo-rl-dir"]
    assert main(no_nemo) == 2
    assert "nemo_rl_dir (set --config nemo_rl_dir=" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(argv(world, "paper-h100", "table1", "Qwen3-8B/DFlash", out, "--dry-run", nemo=tmp_path / "empty")) == 2
    assert f"NeMo-RL checkout: {tmp_path / 'empty'} has no nemo_rl/ package" in capsys.readouterr().err
    data = make_data(tmp_path / "d", load_profile("paper-h100"), skip_checkpoints=("qwen3-8b-dflash",))
    assert main(argv(world, "paper-h100", "table1", "Qwen3-8B/DFlash", out, "--dry-run", data=data)) == 2
    err = capsys.readouterr().err
    assert f"checkpoint qwen3-8b-dflash: {data['checkpoint_root'] / 'Qwen3-8B-DFlash-b16'} does not exist" in err
    assert not out.exists()                                  # nothing written before the checks pass


def test_checkout_without_the_stack_is_named(world, tmp_path):
    profile = load_profile("paper-h100")
    paths = Paths(
        make_checkout(tmp_path / "old", refusals=("pp_block", "cp", "packing"),
                      missing=(f"{checks.DRAFT_DIR}/dspark.py",)),
        world["data"]["paper-h100"]["checkpoint_root"], world["data"]["paper-h100"]["hf_home"])
    on_disk, _ = checks.problems(resolve("paper-h100", "table1", "Qwen3-8B/DFlash"), profile, paths, "local")
    text = "; ".join(on_disk)
    assert "missing NVIDIA-NeMo/RL PR 4060 (block drafts, DFlash/DSpark, under pipeline parallelism) in the NeMo-RL " \
        "checkout" in checks.describe(resolve("paper-h100", "table1", "Qwen3-8B/DFlash"), "local", on_disk)
    assert "PR 4059 (drafts under context parallelism)" in text and "PR 4059 (draft training on packed" in text
    on_disk, _ = checks.problems(resolve("paper-h100", "table2", "DSpark"), profile, paths, "local")
    assert any(p.startswith("DSpark co-training in the NeMo-RL checkout") and "PR 3713" in p for p in on_disk)
    on_disk, _ = checks.problems(resolve("paper-h100", "table2", "no draft"), profile, paths, "local")
    assert on_disk == []                                     # the baseline needs no draft stack
    main_only = Paths(make_checkout(tmp_path / "main", drop_draft_keys=("ttt_steps", "method", "gamma")),
                      paths.checkpoint_root, paths.hf_home)
    on_disk, _ = checks.problems(resolve("paper-h100", "table2", "EAGLE-3"), profile, main_only, "local")
    assert any("multi-pass EAGLE-3 in the NeMo-RL checkout" in p and "ttt_steps; NVIDIA-NeMo/RL PR 3699" in p
               for p in on_disk)


def test_block_size_and_datasets_are_checked(world, tmp_path):
    profile = load_profile("paper-h100")
    data = make_data(tmp_path / "d", profile, block_sizes={"qwen3-8b-dflash": 8})
    spec = resolve("paper-h100", "table1", "Qwen3-8B/DFlash")
    on_disk, _ = checks.problems(spec, profile, Paths(world["nemo"], data["checkpoint_root"], tmp_path), "local")
    text = "; ".join(on_disk)
    assert "records block_size 8, the profile says 16" in text
    assert "dataset BytedTsinghua-SIA/DAPO-Math-17k in the Hugging Face cache" in text
    on_disk, _ = checks.problems(resolve("paper-h100", "fig4", "DFlash"), profile,
                                 Paths(world["nemo"], data["checkpoint_root"]), "local")
    assert any(p.startswith("dataset_root (set --dataset-root") for p in on_disk)


def _machine(n, name="NVIDIA H100 80GB HBM3"):
    return {"gpus": {"devices": [{"name": name, "memory_gb": 79.6}] * n}}


def test_gpu_count_and_model_are_checked(world, monkeypatch):
    monkeypatch.setattr(checks.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    profile, d = load_profile("paper-h100"), world["data"]["paper-h100"]
    paths = Paths(world["nemo"], d["checkpoint_root"], d["hf_home"], d["dataset_root"])
    spec = resolve("paper-h100", "table1", "Qwen3-8B/DFlash")
    checks.check_row(spec, profile, paths, "local", machine=_machine(8))     # enough: no error
    with pytest.raises(checks.CheckError, match=r"8 GPUs for TP/PP/CP/EP = 2/2/2/1 \(detected: 4 \(NVIDIA H100"):
        checks.check_row(spec, profile, paths, "local", machine=_machine(4))
    with pytest.raises(checks.CheckError, match=r"GPU model H100 \(detected: NVIDIA A100"):
        checks.check_row(spec, profile, paths, "local", machine=_machine(8, "NVIDIA A100-SXM4-80GB"))
    big = resolve("paper-gb200", "table1", "GPT-OSS-120B/DFlash")
    with pytest.raises(checks.CheckError, match="a launcher for 8 nodes x 4 GPUs: a local launch runs on one node"):
        checks.check_row(big, load_profile("paper-gb200"), paths, "local", machine=_machine(4, "NVIDIA GB200"))
    with pytest.raises(checks.CheckError, match="container"):
        checks.check_row(big, load_profile("paper-gb200"), paths, "ray-sub")


def test_a_real_launch_without_gpus_writes_no_run(world, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(checks.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(checks, "gpu_problems", lambda spec, profile, machine: ["8 GPUs (detected: none)"])
    out = tmp_path / "run"
    assert main(argv(world, "paper-h100", "table2", "DFlash", out)) == 2
    assert "missing 8 GPUs (detected: none)" in capsys.readouterr().err
    assert not (out / "env.json").exists()


def test_wandb_disabled_is_refused(world, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert main(argv(world, "paper-h100", "table2", "DFlash", tmp_path / "r", "--config-only")) == 2
    assert "WANDB_MODE=disabled" in capsys.readouterr().err


def test_unknown_row_lists_the_valid_ones(capsys, tmp_path):
    assert main(["--profile", "paper-h100", "--artifact", "table2", "--row", "Medusa", "--out", str(tmp_path)]) == 2
    assert "table2 has no row 'Medusa' in profile 'paper-h100'; expected one of: 'no draft', 'EAGLE-3'" in \
        capsys.readouterr().err


def test_a_local_launch_runs_the_printed_command_and_finishes(world, tmp_path, monkeypatch, capsys):
    """The command runs as printed: `uv run` (a stand-in that execs this Python) records the running
    machine, runs the checkout's entry script (a stand-in logging to W&B like NeMo-RL), then the run
    folder gets the suite's metrics.jsonl and, last, run.json."""
    import json
    import os
    bin_dir = fake_uv(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr(checks, "gpu_problems", lambda spec, profile, machine: [])
    out = tmp_path / "run"
    assert main(argv(world, "paper-h100", "table2", "DFlash", out)) == 0
    assert "wrote" in capsys.readouterr().out
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, 11))          # table2: 10 steps
    assert steps[0]["train/rollout_time_s"] == 4.0 and steps[0]["train/gen_tokens"] == 100.0 * 64 * 32
    assert steps[0]["train/acceptance_length"] == 2.5
    env = json.loads((out / "env.json").read_text())
    assert env["engine"] == "nemo-rl" and "generated_on" in env      # runtime_env ran where NeMo-RL ran
    assert json.loads((out / "run.json").read_text())["steps"] == 10
    # A rerun of a table row (no checkpoints) starts afresh: one W&B log, not two.
    assert main(argv(world, "paper-h100", "table2", "DFlash", out)) == 0
    assert len(list((out / "nemo_rl_logs").glob("exp_*/wandb/wandb/*run-*/run-*.wandb"))) == 1

