"""The PP harness against a single-process run (gloo on CPU, kernels.launch.spawn).

For PP = 2 and 4 and each schedule (1F1B, interleaved 1F1B, zero-bubble V): every tap reaches the
draft bit-exact at the right microbatch, per-microbatch policy and draft losses and every gradient
(policy and draft) equal the single-process reference with the same seed bit for bit, and the
policy's gradients are identical with the channel (and draft) on or off.

    .venv/bin/python -m pytest -q tests/parallel/test_pp_harness.py
"""
from dataclasses import replace

import pytest
import torch

from kernels.launch import spawn
from repro.parallel.harness import PPConfig, check_placement_backend, run_pp_worker
from repro.parallel.reference import run_reference


def on_off_worker(rank, world, cfg):
    on = run_pp_worker(rank, world, cfg)
    off = run_pp_worker(rank, world, replace(cfg, draft=False))
    return {"on": on, "off": off}


def merged(outs, key):
    grads, per_mb, report = {}, [], []
    for o in outs:
        grads.update(o[key]["grads"])
        per_mb += o[key]["per_mb"]
        report += o[key]["tap_report"]
    return grads, sorted(per_mb, key=lambda r: r["seq"]), report


CASES = [(2, "1f1b", "shm"), (2, "interleaved1f1b", "shm"), (2, "zbv", "shm"), (2, "zbv", "gloo"),
         (4, "1f1b", "shm"), (4, "interleaved1f1b", "shm"), (4, "zbv", "shm")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("pp,schedule,transport", CASES)
def test_pp_matches_single_process(pp, schedule, transport):
    try:
        check_placement_backend(schedule, "gloo")
    except RuntimeError as exc:          # this torch cannot run the schedule over gloo (the refusal is tested below)
        pytest.skip(str(exc))
    cfg = PPConfig(pp=pp, schedule=schedule, transport=transport, n_microbatches=4, steps=2,
                   # 1F1B's draft stage holds <= 1 mb: wrap often
                   ring_depth=2 if schedule == "1f1b" else None)
    outs = spawn(on_off_worker, pp, args=(cfg,), timeout_s=220)
    ref = run_reference(cfg)
    grads, per_mb, report = merged(outs, "on")
    assert sorted(grads) == sorted(ref["grads"])
    not_equal = [k for k in ref["grads"] if not torch.equal(grads[k], ref["grads"][k])]
    assert not not_equal, f"gradients differ from the single-process run: {not_equal[:5]}"
    assert [r["seq"] for r in per_mb] == list(range(cfg.steps * cfg.n_microbatches))
    for got, want in zip(per_mb, ref["per_mb"]):
        assert (got["step"], got["mb"]) == (want["step"], want["mb"])
        assert got["policy_loss"] == want["policy_loss"] and got["draft_loss"] == want["draft_loss"]
        assert sorted(got["taps"]) == sorted(want["taps"])
        for tap in want["taps"]:
            assert torch.equal(got["taps"][tap], want["taps"][tap]), f"tap {tap} of seq {got['seq']} differs"
    # the report covers every microbatch that crossed the channel
    assert [r["seq"] for r in report] == list(range(cfg.steps * cfg.n_microbatches))
    assert all(r["bytes"] > 0 and r["tap_wait_s"] >= 0 for r in report)
    # the schedule is untouched: policy gradients are the same with channel + draft off
    grads_off, per_mb_off, _ = merged(outs, "off")
    policy = [k for k in grads if not k.startswith("draft.")]
    assert sorted(policy) == sorted(grads_off)
    assert all(torch.equal(grads[k], grads_off[k]) for k in policy)
    assert [r["policy_loss"] for r in per_mb_off] == [r["policy_loss"] for r in per_mb]


def marked_worker(rank, world, cfg, marker_dir):
    open(f"{marker_dir}/rank{rank}", "w").close()  # imports done, the schedule is about to run
    return run_pp_worker(rank, world, cfg)


@pytest.mark.timeout(120)
def test_inschedule_blocking_negative_control(tmp_path):
    """Taps sent with blocking send/recv on the pipeline's own group from inside the forward (how
    NeMo-RL passes them today) share ordering with the schedule's own P2P: on gloo the run deadlocks
    (it would corrupt activations where the messages matched instead). Either way it must not
    reproduce the reference that TapChannel reproduces bit for bit."""
    cfg = PPConfig(pp=2, schedule="1f1b", transport="inschedule", n_microbatches=2, steps=1)
    try:
        outs = spawn(marked_worker, 2, args=(cfg, str(tmp_path)), timeout_s=20)
    except TimeoutError as exc:
        assert "ranks [0, 1] of 2 still running" in str(exc)
        assert {p.name for p in tmp_path.iterdir()} == {"rank0", "rank1"}, "timed out before the schedule ran"
        return
    ref = run_reference(cfg)
    per_mb = sorted((r for o in outs for r in o["per_mb"]), key=lambda r: r["seq"])
    same = all(a["policy_loss"] == b["policy_loss"] and a["draft_loss"] == b["draft_loss"]
               for a, b in zip(per_mb, ref["per_mb"]))
    assert not same, "in-schedule blocking taps matched the reference; the hazard did not show"


def test_v_placement_over_gloo_is_refused_before_torch_2_12():
    """torch 2.11's pipelining warms up a V placement's stages with a send to the rank itself, which gloo cannot
    make (the rank hung up on "Pair is not connected"): refused with the versions named, before any stage runs."""
    with pytest.raises(RuntimeError, match=r"'zbv' over gloo needs torch >= 2.12 \(installed: 2.11.0\+cu130\)"):
        check_placement_backend("zbv", "gloo", "2.11.0+cu130")
    check_placement_backend("zbv", "nccl", "2.11.0+cu130")           # NCCL sends to itself
    check_placement_backend("zbv", "gloo", "2.12.0")
    check_placement_backend("interleaved1f1b", "gloo", "2.11.0")    # loop placement: neighbours on other ranks
