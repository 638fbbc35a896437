"""Generated NeMo-RL configs, every row of both paper profiles, against the keys and value types of
NeMo-RL's example configs (recorded skeleton, tests/integrations/nemo_rl/fixtures/nemo_rl_skeleton.json, NeMo-RL
refs/pull/3713/head = main @ 2c5ee18f + PRs 3699/3712/3713), and against the paper's settings.

    .venv/bin/python -m pytest -q tests/integrations/nemo_rl/test_nemo_rl_configs.py
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
from fake_checkout import skeleton

from integrations.nemo_rl import config
from integrations.nemo_rl import skeleton as skel
from integrations.nemo_rl.rows import RowError, load_rows
from repro.core.profile import load_profile

pytestmark = pytest.mark.timeout(60)

PROFILES = ("paper-h100", "paper-gb200")
PATHS = config.Paths(nemo_rl_dir=Path("/nemo/RL"), checkpoint_root=Path("/ckpt"), hf_home=Path("/hf"),
                     dataset_root=Path("/data"))
RUN = Path("/results/run")


def all_rows():
    for name in PROFILES:
        for artifact, rows in load_rows(load_profile(name)).items():
            for row, spec in rows.items():
                yield pytest.param(spec, id=f"{name}:{artifact}:{row}")


def examples(spec):
    return [spec.workload.example] + ([skel.EAGLE3_RECIPE] if spec.family else [])


def test_paper_rows_are_all_there():
    """Every row of paper_numbers.csv's table1/table2 has a NeMo-RL row (plus a baseline per target)."""
    import pandas as pd
    paper = pd.read_csv(Path(__file__).parents[3] / "experiments" / "paper_numbers.csv")
    have = {(s.values[0].artifact, s.values[0].row) for s in all_rows()}
    for artifact in ("table1", "table2"):
        rows = set(paper[paper["artifact"] == artifact]["row"]) - {"abstract", "all"}
        assert rows and {(artifact, r) for r in rows} <= have, rows - {r for a, r in have if a == artifact}
    assert {r for a, r in have if a in ("fig3", "fig4")} == {"no draft", "EAGLE-3", "DFlash", "DSpark"}


@pytest.mark.parametrize("spec", all_rows())
def test_generated_config_matches_nemo_rl_skeleton(spec):
    cfg = config.build_config(spec, PATHS, RUN)
    skel.check(config.without_overrides(cfg, spec), skeleton(), examples(spec))
    assert cfg["defaults"] == str(PATHS.nemo_rl_dir / spec.workload.example)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["policy"]["megatron_cfg"].update(context_paralel_size=2),
     "policy.megatron_cfg.context_paralel_size: no such key"),
    (lambda c: c["policy"]["megatron_cfg"].update(tensor_model_parallel_size="2"),
     "'2' is str; NeMo-RL's examples have int"),
    (lambda c: c["policy"]["draft"].update(block_size=16), "not a key of NeMo-RL's DraftConfig"),
    (lambda c: c["policy"]["draft"].update(gamma="15"), "DraftConfig declares int"),
    (lambda c: c["logger"]["wandb"].update(tagz=["x"]), "not a wandb.init argument"),
    (lambda c: c["grpo"].update(num_prompts_per_step={"per_node": 8}), "not a mapping"),
])
def test_skeleton_check_can_fail(edit, message):
    spec = load_rows(load_profile("paper-h100"))["table1"]["Qwen3-8B/DFlash"]
    cfg = config.build_config(spec, PATHS, RUN)
    edit(cfg)
    with pytest.raises(skel.SkeletonError, match=message):
        skel.check(cfg, skeleton(), examples(spec))


def test_paper_settings_in_the_configs():
    rows = load_rows(load_profile("paper-h100"))
    dflash = config.build_config(rows["table1"]["Qwen3-8B/DFlash"], PATHS, RUN)
    mc = dflash["policy"]["megatron_cfg"]
    assert (mc["tensor_model_parallel_size"], mc["pipeline_model_parallel_size"],
            mc["context_parallel_size"]) == (2, 2, 2)
    assert dflash["cluster"] == {"gpus_per_node": 8, "num_nodes": 1}
    assert dflash["policy"]["max_total_sequence_length"] == 4096 + 16384
    assert dflash["data"]["max_input_seq_length"] == 4096 and dflash["policy"]["generation"]["max_new_tokens"] == 16384
    # DFlash block 16: anchor + 15 proposals, the same number in training (gamma) and in vLLM.
    assert dflash["policy"]["draft"]["gamma"] == 15
    spec_cfg = dflash["policy"]["generation"]["vllm_kwargs"]["speculative_config"]
    assert spec_cfg["method"] == "dflash" and spec_cfg["num_speculative_tokens"] == 15
    assert spec_cfg["model"] == dflash["policy"]["draft"]["model_name"] == "/ckpt/Qwen3-8B-DFlash-b16"
    dspark = config.build_config(rows["table2"]["DSpark"], PATHS, RUN)["policy"]
    assert dspark["draft"]["method"] == "dspark" and dspark["draft"]["gamma"] == 7
    assert dspark["generation"]["vllm_kwargs"]["speculative_config"]["num_speculative_tokens"] == 7
    eagle = config.build_config(rows["fig3"]["EAGLE-3"], PATHS, RUN)["policy"]
    assert eagle["draft"]["ttt_steps"] == 3 and "gamma" not in eagle["draft"]
    assert eagle["generation"]["vllm_kwargs"]["speculative_config"]["num_speculative_tokens"] == 3
    # Timing tables: no validation or checkpoint save inside NeMo-RL's timed step; figures: both.
    assert dflash["grpo"]["val_period"] == 0 and dflash["checkpointing"]["enabled"] is False
    fig3 = config.build_config(rows["fig3"]["DSpark"], PATHS, RUN)
    assert fig3["grpo"]["val_period"] == 10 and fig3["checkpointing"] == {
        "enabled": True, "checkpoint_dir": "/results/run/nemo_rl_checkpoints"}
    multi = config.build_config(rows["fig4"]["DFlash"], PATHS, RUN)
    assert multi["policy"]["max_total_sequence_length"] == 32768
    assert multi["data"]["train"]["data_path"] == "/data/workplace_assistant/train.jsonl"
    assert multi["defaults"].endswith("examples/nemo_gym/grpo_workplace_assistant_nemotron_nano_v2_9b.yaml")


def test_baseline_is_the_same_run_without_the_draft():
    rows = load_rows(load_profile("paper-h100"))["table1"]
    spec = rows["Qwen3-8B/DSpark"]
    assert (spec.baseline_row == "Qwen3-8B/no draft"
            and rows["Qwen3.5-35B-A3B/DFlash"].baseline_row.startswith("Qwen3.5"))
    draft = skel.flatten(config.build_config(spec, PATHS, RUN))
    base = skel.flatten(config.build_config(rows[spec.baseline_row], PATHS, RUN))
    differ = {k for k in draft.keys() | base.keys() if draft.get(k) != base.get(k)}
    assert differ and all(k.startswith(("policy.draft.", "policy.generation.vllm_kwargs.speculative_config.",
                                        "logger.wandb.")) for k in differ), differ
    assert base["policy.draft.enabled"] is False


def test_gb200_rows_fit_their_nodes():
    rows = load_rows(load_profile("paper-gb200"))["table1"]
    for spec in rows.values():
        lay = spec.layout
        assert lay.gpus_per_node == 4 and lay.gpus % (lay.tp * lay.pp * lay.cp) == 0
        assert (lay.gpus // lay.pp) % lay.ep == 0 and max(lay.tp, lay.pp, lay.cp, lay.ep) <= 16
    assert rows["Nemotron-3.5-Lightning-30B-A3B/DSpark"].family.method == "dspark"


@pytest.mark.parametrize("edit, message", [
    (lambda p: p["nemo_rl"]["models"]["Qwen3-8B"]["parallel"].update(ep=3), "EP = 3 does not divide"),
    (lambda p: p["nemo_rl"]["models"]["Qwen3-8B"]["parallel"].update(tp=3), "does not divide the 8 GPUs"),
    (lambda p: p["table1"]["rows"].pop("Qwen3-8B/no draft"), "baseline 'Qwen3-8B/no draft' must name a row"),
    (lambda p: p["table1"]["rows"]["Qwen3-8B/DFlash"].update(baseline="Qwen3.5-35B-A3B/no draft"),
     "with policy 'Qwen3-8B'"),
    (lambda p: p["table1"]["rows"]["Qwen3-8B/DFlash"].update(draft="medusa"), "draft 'medusa' is not in"),
    (lambda p: p["table1"]["rows"]["Qwen3-8B/DFlash"].update(policy="Llama"), "policy 'Llama' is not in"),
    (lambda p: p["nemo_rl"]["draft_checkpoints"]["Qwen3-8B/dflash"].pop("block_size"), "missing key 'block_size'"),
    (lambda p: p["nemo_rl"]["drafts"]["dflash"].update(method="dflash2"), "method: 'dflash2'"),
    (lambda p: p["nemo_rl"]["artifacts"]["fig3"].update(val_period=0), "must be >= 0, and > 0 when checkpointing"),
    (lambda p: p["nemo_rl"]["artifacts"].pop("fig4"), "missing key 'fig4'"),
    (lambda p: p["fig4"]["workload"].update(name="chess"), "'chess' is not in nemo_rl.workloads"),
    (lambda p: p["nemo_rl"]["workloads"]["workplace"].pop("tool_parser"), "workplace: missing key 'tool_parser'"),
    (lambda p: p["nemo_rl"]["workloads"]["math"].update(max_response_tokens=0), "max_response_tokens: 0 must be >= 1"),
])
def test_bad_profile_sections_fail_clearly(edit, message):
    profile = copy.deepcopy(load_profile("paper-h100"))
    edit(profile)
    with pytest.raises(RowError, match=message):
        load_rows(profile)
