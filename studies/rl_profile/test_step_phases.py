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

    assert main(["--profile", "cpu-tiny", "--rows", "2", "--tokens", "16", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.split()[:2] for line in lines] == (
        [["float32", e] for e in ("grouped_mm", "batched_mm", "eager", "grouped_mm+cast")]
        + [["bfloat16", e] for e in ("grouped_mm", "batched_mm", "eager")])
    losses = [float(line.split()[4]) for line in lines]
    assert max(losses) - min(losses) < 1e-2          # the same model: implementations agree


def test_experts_cast_keeps_the_gradients_of_the_fp32_weights():
    """The candidate fix: under bf16 autocast the experts' gradients still reach their fp32 weights, near the
    uncast path's; outside autocast the wrapper changes nothing."""
    from repro.models.policy import build_policy
    from studies.rl_profile.moe_experts import experts_in_autocast_dtype

    pol = build_policy("qwen3_moe", "tiny", seed=0, vocab_size=64)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))

    def grads():
        pol.model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = pol.forward_train(ids, want_taps=False).logits
        logits.float().square().mean().backward()
        return {n: p.grad.clone() for n, p in pol.model.named_parameters() if "experts" in n}

    plain_logits = pol.forward_train(ids, want_taps=False).logits
    want = grads()
    wrapped = experts_in_autocast_dtype(pol.model)
    assert wrapped and torch.equal(pol.forward_train(ids, want_taps=False).logits, plain_logits)
    got = grads()
    assert got.keys() == want.keys() and all(g.dtype == torch.float32 for g in got.values())
    for name in want:              # bf16 GEMMs against fp32 ones: agreement to bf16 rounding, in norm
        assert (got[name] - want[name]).norm() <= 2e-2 * want[name].norm(), name
