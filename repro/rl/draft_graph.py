"""The block draft's training step (loss forward and backward) as one CUDA graph per batch shape.

At one-GPU RL scale the block drafts' training step is host-bound (on the H200, per 32 rows: ~1,400 operator
launches for ~14 ms of kernels on the ring route; 627-746 operators for 5.6-6.0 ms on the padded route it uses now;
results/1xh200/h200/SESSION5.md). ``DraftTrainStep`` records the step once per shape and replays it, so its cost
becomes its kernels (measured: 11-12 ms per 64-row call graphed, 13-16 ms eager):

1. anchors are drawn on the host as in the eager loss (``sample_anchors``: same generator, same draw);
2. rows are right-padded to a multiple of ``seq_bucket`` tokens (few shapes over a run, so few captures;
   pad tokens are never anchors, never visible context and never targets, so the loss is unchanged);
3. ``loss = draft.anchored_loss(...)`` and ``torch.autograd.grad(loss, draft parameters)`` run as one
   graph (``repro.rollout.cuda_graph.GraphedCallable``: warm-up, capture, replay; eager on CPU, when
   disabled, or when capture fails, with the reason kept);
4. the gradients are added to ``p.grad`` times the caller's weight (``lambda x rows share``), as the
   eager ``(weight * loss).backward()`` would.

Only the deferred draft pass uses it (``draft.microbatch`` > the policy's microbatch, repro.rl.joint):
there the draft's inputs are detached taps and logits, so its graph owns its whole backward.

    step = DraftTrainStep(draft, cuda_graphs=True)
    loss = step(ids, draft_mask, policy_logits, fused_taps, generator, weight=lam * rows / batch,
                autocast_dtype=torch.bfloat16)                                       # grads added to p.grad

GPU check (loss and gradients of the graphed step vs the eager one, and the time of each; JSON):

    python -m repro.rl.draft_graph --out $OUT/draft_graph --profile h200
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from repro.models.block_draft import sample_anchors
from repro.rollout.cuda_graph import GraphedCallable


def _pad_rows(x: torch.Tensor, length: int) -> torch.Tensor:
    """``x [B, S, ...]`` right-padded with zeros to ``[B, length, ...]``."""
    extra = length - x.shape[1]
    if extra == 0:
        return x
    return F.pad(x, (0, 0) * (x.dim() - 2) + (0, extra))


class DraftTrainStep:
    """A block draft's loss + backward (graphed on CUDA); see the module docstring."""

    def __init__(self, draft: nn.Module, *, cuda_graphs: bool, seq_bucket: int = 64):
        if not hasattr(draft, "anchored_loss"):
            raise ValueError(f"{type(draft).__name__} has no anchored_loss: only the block drafts (DFlash, DSpark) "
                             "run their training step as a CUDA graph")
        if seq_bucket < 1:
            raise ValueError(f"seq_bucket must be >= 1 token, got {seq_bucket}")
        self.draft, self.seq_bucket = draft, seq_bucket
        self.params = [p for p in draft.parameters() if p.requires_grad]
        self.graph = GraphedCallable(self._loss_and_grads, f"{type(draft).__name__}.train_step", enabled=cuda_graphs)

    def status(self) -> dict:
        return self.graph.status()

    def _loss_and_grads(self, ids, loss_mask, policy_logits, anchors, anchor_valid, taps, *, autocast: str):
        self.draft.backbone.rope.forget()        # no cos/sin memo across calls (a replay must recompute them)
        # the autocast dtype is a setting of the call, so each dtype gets its own graph
        amp = (torch.autocast(ids.device.type, dtype=getattr(torch, autocast), cache_enabled=False)
               if autocast else contextlib.nullcontext())
        with torch.enable_grad():
            with amp:
                loss = self.draft.anchored_loss(ids, taps, policy_logits, loss_mask, anchors, anchor_valid)
            grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        return (loss.detach(), *grads)

    def __call__(self, ids: torch.Tensor, loss_mask: torch.Tensor, policy_logits: torch.Tensor,
                 taps: torch.Tensor, generator: torch.Generator | None, *, weight: float,
                 autocast_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The draft's loss over rows ``ids [B, S]`` (a new tensor); ``weight * grad`` is added to the
        draft's ``.grad``. ``taps [B, S, F]`` are the draft's fused taps (``TargetFeatures.concat``),
        ``loss_mask`` its prediction mask (repro.rl.joint.draft_loss_mask)."""
        anchors, valid = sample_anchors(loss_mask, self.draft.cfg.num_anchors, generator)
        S = ids.shape[1]
        length = -(-S // self.seq_bucket) * self.seq_bucket
        out = self.graph(_pad_rows(ids, length), _pad_rows(loss_mask, length), _pad_rows(policy_logits, length),
                         anchors, valid, _pad_rows(taps, length),
                         autocast=str(autocast_dtype).removeprefix("torch.") if autocast_dtype is not None else "")
        loss, grads = out[0].clone(), out[1:]
        with torch.no_grad():
            for p, g in zip(self.params, grads):
                if g is None:
                    continue
                if p.grad is None:
                    p.grad = g * weight
                else:
                    p.grad.add_(g, alpha=weight)
        return loss


# -- GPU check: the graphed step against the eager one at the profile's update shapes ------------------------------

def _max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def check_family(name: str, spec, policy, rows: int, lengths: list[int], prompt_len: int, repeats: int,
                 autocast_dtype) -> dict:
    """Eager vs graphed step of one block draft: loss, gradients, seconds per step, graph status."""
    from repro.bench.common import summarize, time_samples
    from repro.rl.drafts import build_draft
    from repro.rl.joint import draft_loss_mask
    dev = policy.device
    draft = build_draft(spec, policy, mask_token_id=policy.vocab_size - 1, train=True).to(dev)
    steps = {m: DraftTrainStep(draft, cuda_graphs=m == "graphed") for m in ("eager", "graphed")}
    out: dict = {"lengths": {}}
    g = torch.Generator().manual_seed(0)
    for S in lengths:
        ids = torch.randint(0, policy.vocab_size - 1, (rows, S), generator=g).to(dev)
        token_mask = torch.zeros(rows, S, device=dev)
        token_mask[:, prompt_len:] = 1
        with torch.no_grad(), torch.autocast(dev.type, dtype=autocast_dtype):
            fwd = policy.forward_train(ids, want_taps=True)
        taps = torch.cat([t.detach() for t in fwd.taps], dim=-1)   # the policy's tap order is the draft's here
        logits, mask = fwd.logits.detach(), draft_loss_mask(token_mask)
        res: dict = {}
        for mode, step in steps.items():
            def one(step=step, args=(ids, mask, logits, taps), seed=S):
                draft.zero_grad(set_to_none=True)
                return step(*args, torch.Generator().manual_seed(seed), weight=1.0, autocast_dtype=autocast_dtype)
            loss = one()
            grads = [p.grad.clone() for p in step.params if p.grad is not None]
            secs = time_samples(one, warmup=2, repeats=repeats, device=dev)
            res[mode] = {"loss": float(loss), "grads": grads, "seconds": secs, "s": summarize(secs)}
        e, gr = res["eager"], res["graphed"]
        out["lengths"][str(S)] = {
            "loss_eager": e["loss"], "loss_graphed": gr["loss"],
            "loss_rel_diff": abs(e["loss"] - gr["loss"]) / max(abs(e["loss"]), 1e-30),
            "grad_max_rel_diff": max(_max_rel_diff(a, b) for a, b in zip(gr["grads"], e["grads"])),
            "eager_s": e["s"], "graphed_s": gr["s"], "eager_samples": e["seconds"], "graphed_samples": gr["seconds"],
            "speedup": e["s"]["median"] / gr["s"]["median"]}
    out["graph"] = steps["graphed"].status()
    worst = max(v["grad_max_rel_diff"] for v in out["lengths"].values())
    out["passed"] = (out["graph"]["captures"] == len(lengths) and out["graph"]["fallback_reason"] is None
                     and worst < 2e-2 and all(v["loss_rel_diff"] < 1e-2 for v in out["lengths"].values()))
    print(f"[{name}] " + "; ".join(f"S={S}: eager {v['eager_s']['median'] * 1e3:.1f} ms, graphed "
                                   f"{v['graphed_s']['median'] * 1e3:.1f} ms ({v['speedup']:.2f}x), loss rel diff "
                                   f"{v['loss_rel_diff']:.1e}, grad rel diff {v['grad_max_rel_diff']:.1e}"
                                   for S, v in out["lengths"].items()) + f"; graph {out['graph']}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    import traceback
    from pathlib import Path

    from repro.report.provenance import provenance, write_json_atomic
    from repro.rl.config import DraftSpec, PolicySpec, load_run_profile
    from repro.rl.warmstart import make_policy
    ap = argparse.ArgumentParser(description="GPU check of the graphed block-draft training step: the same loss and "
                                             "gradients as the eager step, and the time of each")
    ap.add_argument("--out", required=True, help="folder for draft_graph_check.json")
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--families", default="dflash,dspark", help="block-draft keys of the profile's rl.drafts")
    ap.add_argument("--rows", type=int, default=64, help="rows per draft call (the h200 profile's draft.microbatch)")
    ap.add_argument("--lengths", default="126,150", help="row lengths to check (each bucket is one capture)")
    ap.add_argument("--prompt-len", type=int, default=78, help="tokens before the first trained one")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the graphed step's check needs a CUDA device (on CPU the step runs eagerly: "
                         "tests/rl/test_draft_graph.py checks that path)")
    lengths = [int(x) for x in args.lengths.split(",") if x]
    if not lengths or min(lengths) <= args.prompt_len + 1:
        raise SystemExit(f"--lengths {lengths} must be longer than --prompt-len + 1 = {args.prompt_len + 1}")
    rl = load_run_profile(args.profile)["rl"]
    pspec = PolicySpec(**{k: v for k, v in rl["policies"]["dense"].items() if k != "mesh"})
    policy = make_policy(pspec, int(rl.get("vocab_size", 512)), seed=0, dtype=torch.float32, device="cuda")
    config = {"profile": args.profile, "families": args.families, "rows": args.rows, "lengths": lengths,
              "prompt_len": args.prompt_len, "repeats": args.repeats, "autocast": "bfloat16",
              "policy": rl["policies"]["dense"]}
    report = {"provenance": provenance(config), "config": config, "families": {}}
    for fam in [f for f in args.families.split(",") if f]:
        try:
            report["families"][fam] = check_family(fam, DraftSpec(**rl["drafts"][fam]), policy, args.rows, lengths,
                                                   args.prompt_len, args.repeats, torch.bfloat16)
        except Exception as exc:        # noqa: BLE001 - record it, check the next family
            traceback.print_exc()
            report["families"][fam] = {"passed": False, "error": f"{type(exc).__name__}: {exc}"}
    report["passed"] = all(v.get("passed") for v in report["families"].values())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(args.out) / "draft_graph_check.json", report)
    print(f"draft graph check {'passed' if report['passed'] else 'FAILED'}: {args.out}/draft_graph_check.json")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
