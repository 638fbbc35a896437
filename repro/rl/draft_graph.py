"""A draft's training step (loss forward and backward) as one CUDA graph per batch shape.

At one-GPU RL scale the drafts' training step is host-bound (on the H200, per 32 rows: ~1,400 operator
launches for ~14 ms of kernels on a block draft's ring route; 627-746 operators for 5.6-6.0 ms on the padded route
it uses now; measured on one H200). ``DraftTrainStep`` records the step once per shape and replays it, so its cost
becomes its kernels (measured for the block drafts: 11-12 ms per 64-row call graphed, 13-16 ms eager):

1. the block drafts' anchors are drawn on the host as in the eager loss (``sample_anchors``: same generator, same
   draw); EAGLE-3 has none (its TTT loss covers every position);
2. rows are right-padded to a multiple of ``seq_bucket`` tokens (few shapes over a run, so few captures;
   pad tokens are never anchors, never visible context and never targets, so the loss is unchanged);
3. the loss on the padded routes (one masked SDPA per attention: ``block_draft.anchored_loss`` for DFlash and DSpark,
   ``Eagle3Draft.ttt_loss(attn_impl="padded")`` for EAGLE-3; no host work) and ``torch.autograd.grad(loss, draft
   parameters)`` run as one graph (``repro.decoding.cuda_graph.GraphedCallable``: warm-up, capture, replay; eager on
   CPU, when disabled, or when capture fails, with the reason kept);
4. the gradients are added to ``p.grad`` times the caller's weight (``lambda x rows share``), as the
   eager ``(weight * loss).backward()`` would.

Only the deferred draft pass uses it (``draft.microbatch`` > the policy's microbatch, repro.rl.joint):
there the draft's inputs are detached taps and logits, so its graph owns its whole backward.

    step = DraftTrainStep(draft, cuda_graphs=True)
    loss = step(ids, draft_mask, policy_logits, fused_taps, generator, weight=lam * rows / batch,
                autocast_dtype=torch.bfloat16)                                       # grads added to p.grad
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from repro.decoding.cuda_graph import GraphedCallable
from repro.models.block_draft import sample_anchors


def pad_rows(x: torch.Tensor, length: int) -> torch.Tensor:
    """``x [B, S, ...]`` right-padded with zeros to ``[B, length, ...]``."""
    extra = length - x.shape[1]
    if extra == 0:
        return x
    return F.pad(x, (0, 0) * (x.dim() - 2) + (0, extra))


class DraftTrainStep:
    """A draft's loss + backward (graphed on CUDA); see the module docstring."""

    def __init__(self, draft: nn.Module, *, cuda_graphs: bool, seq_bucket: int = 64):
        self.anchored = hasattr(draft, "anchored_loss")
        if not self.anchored and not hasattr(draft, "ttt_loss"):
            raise ValueError(f"{type(draft).__name__} has neither anchored_loss (DFlash, DSpark) nor ttt_loss "
                             "(EAGLE-3): its training step has no padded route to run as a CUDA graph")
        if seq_bucket < 1:
            raise ValueError(f"seq_bucket must be >= 1 token, got {seq_bucket}")
        self.draft, self.seq_bucket = draft, seq_bucket
        self.rope = draft.backbone.rope if self.anchored else draft.rope
        self.params = [p for p in draft.parameters() if p.requires_grad]
        # the sequence buckets' graphs share one memory pool (a run's longest rows hold the most activations, not
        # the sum over every bucket met): safe, as each call's loss and gradients are read before the next call.
        # Under shared_graph_pools (a lockstep's rows, updating one after another) every draft's step shares it
        self.graph = GraphedCallable(self._loss_and_grads, f"{type(draft).__name__}.train_step", enabled=cuda_graphs,
                                     shared_pool=True, pool_key="draft.train_step")

    def bucket_length(self, length: int) -> int:
        """The padded length a call over rows of ``length`` tokens runs (and is captured) at."""
        return -(-length // self.seq_bucket) * self.seq_bucket

    def status(self) -> dict:
        return self.graph.status()

    def loss(self, ids, loss_mask, policy_logits, taps, *anchors) -> torch.Tensor:
        """The draft's loss on its padded route over padded rows: the forward the graph records."""
        self.rope.forget()                       # no cos/sin memo across calls (a replay must recompute them)
        if self.anchored:
            return self.draft.anchored_loss(ids, taps, policy_logits, loss_mask, *anchors)
        return self.draft.ttt_loss(ids, taps, policy_logits, loss_mask, attn_impl="padded")[0]

    def _loss_and_grads(self, ids, loss_mask, policy_logits, taps, *anchors, autocast: str):
        # the autocast dtype is a setting of the call, so each dtype gets its own graph
        amp = (torch.autocast(ids.device.type, dtype=getattr(torch, autocast), cache_enabled=False)
               if autocast else contextlib.nullcontext())
        with torch.enable_grad():
            with amp:
                loss = self.loss(ids, loss_mask, policy_logits, taps, *anchors)
            grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        return (loss.detach(), *grads)

    def __call__(self, ids: torch.Tensor, loss_mask: torch.Tensor, policy_logits: torch.Tensor,
                 taps: torch.Tensor, generator: torch.Generator | None, *, weight: float,
                 autocast_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The draft's loss over rows ``ids [B, S]`` (a new tensor); ``weight * grad`` is added to the
        draft's ``.grad``. ``taps [B, S, F]`` are the draft's fused taps (``TargetFeatures.concat``),
        ``loss_mask`` its prediction mask (repro.rl.joint.draft_loss_mask)."""
        anchors = sample_anchors(loss_mask, self.draft.cfg.num_anchors, generator) if self.anchored else ()
        length = self.bucket_length(ids.shape[1])
        out = self.graph(pad_rows(ids, length), pad_rows(loss_mask, length), pad_rows(policy_logits, length),
                         pad_rows(taps, length), *anchors,
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
