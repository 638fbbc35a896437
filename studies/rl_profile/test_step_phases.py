"""studies/rl_profile: the phase table reads the named ranges the trainer and the joint update open."""
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from studies.rl_profile.step_phases import phase_times


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
