"""Generated configs against NeMo-RL's own loader and MasterConfig: replayed on two recorded commits
(tests/integrations/nemo_rl/fixtures/nemo_rl-7ea279a: main; nemo_rl-2b69e2b: the PR 3713 head), and through the
subprocess the suite starts in a checkout (``uv run`` of integrations/nemo_rl/upstream_check.py; here a
stand-in checkout whose MasterConfig replays the recorded schema). The upstream-today layout
(PP = CP = 1, packing off) and the packing probe.

    .venv/bin/python -m pytest -q tests/integrations/nemo_rl/test_nemo_rl_upstream.py
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from fake_checkout import RECORDED_MAIN, RECORDED_PR3713, fake_uv, make_checkout, make_data

from integrations.nemo_rl import checks, config, upstream
from integrations.nemo_rl.rows import LAYOUTS, load_rows, resolve, with_layout
from integrations.nemo_rl.run import main
from repro.core.profile import load_profile

pytestmark = pytest.mark.timeout(120)

PATHS = config.Paths(nemo_rl_dir=Path("/nemo/RL"), checkpoint_root=Path("/ckpt"), hf_home=Path("/hf"),
                     dataset_root=Path("/data"))
MISSING = "policy.megatron_cfg.moe_per_layer_logging"


def rows(layout="paper"):
    for name in ("paper-h100", "paper-gb200"):
        for specs in load_rows(load_profile(name)).values():
            for spec in specs.values():
                yield with_layout(spec, layout)


def errors(spec, recorded, drop_overrides=False):
    cfg = config.build_config(spec, PATHS, Path("/results/run"))
    if drop_overrides:
        cfg = config.without_overrides(cfg, spec)
    return upstream.recorded_errors(cfg, upstream.load_recorded(recorded), spec.workload.example)


@pytest.mark.parametrize("recorded", [RECORDED_MAIN, RECORDED_PR3713], ids=["main", "pr3713"])
def test_fig4_needs_what_the_workplace_example_lacks(recorded):
    """The issue's rejection, replayed: without the workload's overrides every fig4 config misses a
    required MegatronConfig key; with them (the profile's config_overrides) none does."""
    fig4 = [s for s in rows() if s.artifact == "fig4"]
    assert len(fig4) == 4
    for spec in fig4:
        found = {(e["key"], e["error"], e["branch"]) for e in errors(spec, recorded, drop_overrides=True)}
        assert (MISSING, "Field required", "MegatronConfig") in found, spec.row
        assert not [e for e in errors(spec, recorded) if e["key"] == MISSING]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_row_is_accepted_by_the_pr3713_head(layout):
    for spec in rows(layout):
        assert errors(spec, RECORDED_PR3713) == [], (spec.profile, spec.artifact, spec.row)


def test_main_keeps_draft_keys_it_never_reads():
    """On main the draft block has only its first keys: the strict check names every other one."""
    for spec in rows():
        found = {e["key"] for e in errors(spec, RECORDED_MAIN)}
        if spec.family is None:
            assert found == set(), spec.row
        else:
            assert "policy.draft.method" in found, spec.row


def test_the_recorded_check_can_fail_on_types_and_enums():
    spec = resolve("paper-h100", "table1", "Qwen3-8B/DFlash")
    cfg = config.build_config(spec, PATHS, Path("/r"))
    cfg["policy"]["megatron_cfg"]["tensor_model_parallel_size"] = "two"
    cfg["policy"]["draft"]["anchors_per_sequence"] = 64
    found = {e["key"] for e in upstream.recorded_errors(cfg, upstream.load_recorded(RECORDED_PR3713),
                                                        spec.workload.example)}
    assert {"policy.megatron_cfg.tensor_model_parallel_size", "policy.draft.anchors_per_sequence"} <= found


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_uv(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("WANDB_MODE", "offline")
    return make_checkout(tmp_path / "RL")


def test_the_checkout_rejects_naming_the_key(checkout, tmp_path):
    """Through the subprocess: upstream_check.py runs the checkout's load_config and MasterConfig (a
    stand-in replaying the recorded schema, raising pydantic's ValidationError) and the draft check."""
    spec = resolve("paper-h100", "fig4", "DFlash")
    paths = config.Paths(checkout, Path("/ckpt"), dataset_root=Path("/data"))
    cfg = config.build_config(spec, paths, tmp_path)
    good = config.write_config(cfg, spec, tmp_path / "good", "t")
    bad_cfg = config.without_overrides(cfg, spec)
    bad_cfg["policy"]["draft"]["gama"] = 15
    bad = config.write_config(bad_cfg, spec, tmp_path / "bad", "t")
    assert upstream.check_in_checkout([good], checkout) == "unknown"     # a stand-in, not a git checkout
    with pytest.raises(upstream.UpstreamError) as exc:
        upstream.check_in_checkout([good, bad], checkout)
    text = str(exc.value)
    assert f"rejects {bad}" in text and str(good) not in text
    assert f"{MISSING}: Field required (as MegatronConfig)" in text
    assert "policy.draft.gama: not a key of the checkout's DraftConfig" in text


def test_the_cli_keeps_no_rejected_config(checkout, tmp_path, capsys, monkeypatch):
    import dataclasses

    from integrations.nemo_rl import run

    def as_before_the_fix(spec, layout):     # the example's keys only, no config_overrides
        return dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, overrides={}))
    monkeypatch.setattr(run, "with_layout", as_before_the_fix)
    data = make_data(tmp_path / "d", load_profile("paper-h100"))
    out = tmp_path / "run"
    args = ["--profile", "paper-h100", "--artifact", "fig4", "--row", "no draft", "--out", str(out),
            "--nemo-rl-dir", str(checkout), "--checkpoint-root", str(data["checkpoint_root"]),
            "--dataset-root", str(data["dataset_root"]), "--config-only"]
    assert main(args) == 2
    assert MISSING in capsys.readouterr().err
    assert not (out / config.CONFIG_NAME).exists() and (out / config.REJECTED_NAME).is_file()
    assert not (out / "env.json").exists()
    assert main(args + ["--no-upstream-check"]) == 0
    assert "NOT validated by its MasterConfig" in (out / config.CONFIG_NAME).read_text()


def test_upstream_today_layout_is_labelled_and_passes_the_probes(checkout, tmp_path):
    spec = resolve("paper-h100", "table1", "Qwen3-8B/DSpark")
    today = with_layout(spec, "upstream-today")
    assert (today.layout.tp, today.layout.pp, today.layout.cp, today.layout.gpus) == (2, 1, 1, 8)
    old = make_checkout(tmp_path / "old", refusals=("pp_block", "cp", "packing"))
    assert any("lm_policy.py still raises '...does not support sequence packing...'" in p
               for p in checks.checkout_problems(spec, old, "local"))
    assert checks.checkout_problems(today, old, "local") == []
    paths = config.Paths(checkout, Path("/ckpt"), hf_home=Path("/hf"))
    cfg = config.build_config(today, paths, tmp_path)
    assert cfg["policy"]["sequence_packing"] == {"enabled": False}
    assert cfg["policy"]["megatron_cfg"]["pipeline_model_parallel_size"] == 1
    assert "layout:upstream-today" in cfg["logger"]["wandb"]["tags"]
    text = config.config_yaml(cfg, today, "t")
    assert "NOT the paper's layout" in text.splitlines()[1]
    assert yaml.safe_load(text)["policy"]["megatron_cfg"]["context_parallel_size"] == 1
    upstream.check_in_checkout([config.write_config(cfg, today, tmp_path / "x", "t")], checkout)
