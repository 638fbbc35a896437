"""studies/rl_profile: the phase table reads the named ranges the trainer, the joint update and the engine open."""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from repro.models.block_draft import BlockDraftConfig, BlockProposer
from repro.models.dspark import DSparkDraft
from repro.models.policy import build_policy
from repro.rollout.engine import RolloutEngine
from studies.rl_profile.step_phases import PHASES, phase_times, top_in_phase


def test_phase_times_reads_each_named_range():
    x = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("step.update"):
            with record_function("update.policy_forward"):
                for _ in range(20):
                    x = x @ x.T / 64
            with record_function("update.policy_backward"):
                x = x + 1
    t = phase_times(prof)
    assert t["step.update"]["host_ms"] >= t["update.policy_forward"]["host_ms"] > 0
    assert t["update.policy_backward"]["host_ms"] > 0
    assert t["update.draft"]["host_ms"] == 0 and t["step.rollout"]["kernels"] == 0


def test_top_in_phase_counts_only_the_phase_operators():
    x = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        x = torch.sin(x)
        with record_function("step.update"):
            for _ in range(5):
                x = x @ x.T / 64
            x = torch.cos(x)
    ops, kernels = top_in_phase(prof, "step.update", 10)
    calls = {name: n for name, n, _ in ops}
    assert calls["aten::mm"] == 5 and calls["aten::cos"] == 1
    assert "aten::sin" not in calls and "step.update" not in calls and kernels == []


def test_moe_experts_study_times_each_implementation(capsys):
    from studies.rl_profile.moe_experts import main

    assert main(["--profile", "cpu-tiny", "--rows", "2", "--tokens", "16", "--repeats", "1", "--compiled"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    impls = ("grouped_mm", "grouped_mm_autocast", "batched_mm", "eager")
    assert [line.split()[:2] for line in lines] == (
        [["float32", e] for e in impls] + [["float32", "grouped_mm_autocast+compiled"]]
        + [["bfloat16", e] for e in impls])
    losses = [float(line.split()[4]) for line in lines]
    assert max(losses) - min(losses) < 1e-2          # the same model: implementations agree
    compiled = next(line for line in lines if "+compiled" in line)
    assert compiled.endswith("graphs 1")             # one decoder-layer graph: the cast experts break no graph


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["off", "all"])
def test_the_engine_opens_its_rollout_phases(mode):
    """The eager loop (``off``) and the static loop (``all``; eager on a CPU) name their draft and policy calls, so
    the study can split a drafted rollout into the draft's propose and observe, the policy's verify step, the
    acceptance and the host's waits."""
    pol = build_policy("qwen3", "tiny", seed=6, init_std=0.3)
    draft = DSparkDraft(BlockDraftConfig.from_policy(pol, num_layers=1, block_size=4, num_anchors=6), pol)
    pol.set_taps(draft.tap_spec)
    engine = RolloutEngine(pol, BlockProposer(draft), cuda_graphs=mode)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.generate([[5, 9, 2, 7], [1, 3]], max_new_tokens=8, seed=1)
    t = phase_times(prof)
    opened = {name for name in PHASES if name.startswith("rollout.") and t[name]["host_ms"] > 0}
    want = {"rollout.propose", "rollout.verify", "rollout.observe"}
    if mode == "all":
        want |= {"rollout.prefill", "rollout.accept", "rollout.wait"}
    assert opened == want
