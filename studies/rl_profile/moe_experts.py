"""What the MoE policy's update costs per experts implementation: the h200 profile's MoE policy (16 experts, top-2)
forward and backward over one update microbatch, under bf16 autocast over fp32 weights as the update runs it
(``repro.rl.joint``), with each of transformers' experts implementations, and the same with bf16 weights (the
rollout copy's case) beside them. torch's grouped GEMM has its fast path (CUTLASS, no host sync) only for bf16
operands; transformers casts the tokens to the weights' dtype, so fp32 master weights take the per-expert fallback.
``grouped_mm_autocast`` (repro.models.moe_experts, what the policies run) casts the experts' weights to the
autocast dtype for their GEMMs. Prints ms per forward + backward (median), host syncs per call, and the loss
against the first implementation's; ``--compiled`` adds that implementation with the decoder layers compiled, as the
policy's update runs it (``JointUpdate`` compiles an MoE policy's layers where its experts run this implementation
under bf16 autocast, ``compiles_whole``).
Writes nothing; the workflow's ``table1`` is where results come from.

    PYTHONPATH=. python studies/rl_profile/moe_experts.py --profile h200 --compiled     # on a CUDA machine
    PYTHONPATH=. python studies/rl_profile/moe_experts.py --profile cpu-tiny --rows 4 --tokens 32 --repeats 1
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from kernels.attention.sdpa_choice import no_cudnn_sdpa
from repro.core.profile import load_profile
from repro.models.moe_experts import AUTOCAST_EXPERTS
from repro.models.policy import build_policy
from repro.rl.joint import JointUpdate
from repro.rollout.compiled_layers import compiled_layers

IMPLEMENTATIONS = ("grouped_mm", AUTOCAST_EXPERTS, "batched_mm", "eager")


def set_experts(model, name: str) -> None:
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(name)
    else:                                               # an older transformers: the config's field
        model.config._experts_implementation = name


def fwd_bwd(policy, ids: torch.Tensor, weights: torch.dtype, compiled: bool = False) -> float:
    """Forward and backward on ``ids`` (bf16 autocast over fp32 weights, as the update runs); returns the loss.
    ``compiled``: the decoder layers compiled by inductor, as the update runs them
    (``JointUpdate.compile_layers``)."""
    dev = ids.device
    layers = compiled_layers(policy, JointUpdate.COMPILE_BACKEND if compiled else None, purpose="train")
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=weights == torch.float32), layers, \
            no_cudnn_sdpa(dev):
        logits = policy.forward_train(ids, want_taps=False).logits
        out = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    with no_cudnn_sdpa(dev):
        out.backward()
    policy.model.zero_grad(set_to_none=True)
    return out.detach().item()


def host_syncs(policy, ids: torch.Tensor, weights: torch.dtype, compiled: bool = False) -> int:
    """Synchronising CUDA calls in one forward + backward (torch's sync debug mode, counted; 0 off CUDA)."""
    if ids.device.type != "cuda":
        return 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fwd_bwd(policy, ids, weights, compiled)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen)


def time_update(policy, ids: torch.Tensor, weights: torch.dtype, repeats: int,
                compiled: bool = False) -> tuple[float, int, float]:
    """(median ms, host syncs, loss) of forward + backward on ``ids``."""
    cuda = ids.device.type == "cuda"
    times, loss = [], float("nan")
    for _ in range(repeats + 1):                       # the first call warms up (and compiles)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = fwd_bwd(policy, ids, weights, compiled)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times[1:] or times), host_syncs(policy, ids, weights, compiled), loss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h200", help="profile whose rl.policies.moe is timed")
    ap.add_argument("--rows", type=int, default=32, help="sequences per microbatch (the h200 update's: 32)")
    ap.add_argument("--tokens", type=int, default=256, help="tokens per sequence (prompt + answer)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compiled", action="store_true", help=f"one more row: {AUTOCAST_EXPERTS} on fp32 weights with "
                    "the decoder layers compiled (the update's compile_layers), "
                    "with the graphs dynamo compiled for it (one per layer kind: no graph breaks)")
    args = ap.parse_args(argv)
    prof = load_profile(args.profile)
    moe = prof["rl"]["policies"]["moe"]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ids = torch.randint(0, prof["rl"]["vocab_size"], (args.rows, args.tokens),
                        generator=torch.Generator().manual_seed(0)).to(dev)
    print(f"{'weights':8s} {'experts':29s} {'ms fwd+bwd':>11s} {'syncs':>7s} {'loss':>9s}")
    ref = None
    for weights in (torch.float32, torch.bfloat16):
        policy = build_policy(moe["family"], moe["scale"], seed=0, dtype=weights, device=dev,
                              vocab_size=prof["rl"]["vocab_size"], **moe.get("overrides", {}))
        policy.model.train()
        rows = [(name, False) for name in IMPLEMENTATIONS]
        rows += [(AUTOCAST_EXPERTS, True)] if args.compiled and weights == torch.float32 else []
        for name, compiled in rows:
            label = name + ("+compiled" if compiled else "")
            graphs0 = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
            try:
                set_experts(policy.model, name)
                ms, syncs, loss = time_update(policy, ids, weights, args.repeats, compiled)
            except Exception as exc:                    # noqa: BLE001 - an implementation this install lacks
                print(f"{str(weights)[6:]:8s} {label:29s} unavailable: {type(exc).__name__}: {exc}")
                continue
            ref = loss if ref is None else ref
            graphs = int(torch._dynamo.utils.counters["stats"]["unique_graphs"]) - graphs0
            print(f"{str(weights)[6:]:8s} {label:29s} {ms:11.2f} {syncs:7d} {loss:9.4f} (first {ref:.4f})"
                  + (f" graphs {graphs}" if compiled else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
