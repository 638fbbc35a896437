"""DFlash: block-diffusion draft on the shared block backbone; slot s >= 1 predicts x_{a+s}.

Training (shared/reference/draft_families.md section 2.2): anchors sampled per sequence
(``repro.models.block_draft.sample_anchors``), blocks ``[x_a, MASK x (B-1)]``, hard-label cross
entropy on slots 1..B-1 against the sequence tokens, weights ``exp(-(s-1)/gamma)`` times the loss
mask of the prediction (``loss_mask[a+s-1]``) and ``a+s < S``, normalised by the weight sum.
Inference: one backbone pass gives B-1 chain proposals (slots 1..B-1), each drawn from its slot's
distribution through the policy's head.

    draft = DFlashDraft(BlockDraftConfig.from_policy(policy, num_layers=2, block_size=8), policy)
    loss = draft.loss(input_ids, taps, loss_mask, generator=torch.Generator().manual_seed(0))
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from repro.decoding.sampling import probs_from_logits, sample_with_noise
from repro.models.block_draft import BlockDraftBackbone, BlockDraftConfig, sample_anchors
from repro.models.taps import TapSpecFromConfig
from repro.parallel.cp_batch import PackedShard


def gather_rows(x: torch.Tensor, idx: torch.Tensor, fill=0) -> torch.Tensor:
    """``x [B, S, ...]`` at ``idx [B, ...]`` (out-of-range indices give ``fill``)."""
    B, S = x.shape[:2]
    ok = (idx >= 0) & (idx < S)
    flat = idx.clamp(0, S - 1).reshape(B, -1)
    if x.dim() == 2:
        out = x.gather(1, flat).view(idx.shape)
        return out.masked_fill(~ok, fill)      # (no host scalar copied to the device: CUDA-graph safe)
    out = x.gather(1, flat[..., None].expand(-1, -1, x.shape[-1])).view(*idx.shape, x.shape[-1])
    return out.masked_fill(~ok[..., None], fill)


class DFlashDraft(TapSpecFromConfig, nn.Module):
    """DFlash draft model; satisfies ``repro.parallel.draft_interface.TapDraft`` (after ``attach``)."""

    def __init__(self, cfg: BlockDraftConfig, policy=None):
        super().__init__()
        self.cfg = cfg
        self.backbone = BlockDraftBackbone(cfg)
        self.attn_backend = "auto"        # kernels.attention backend used by draft_loss
        if policy is not None:
            self.attach(policy)

    def attach(self, policy) -> None:
        self.backbone.attach(policy)

    @property
    def num_proposals(self) -> int:
        return self.cfg.block_size - 1

    def draft_loss(self, features, batch) -> torch.Tensor:
        """One microbatch's loss; with ``batch.extras["cp"]`` (a ``PackedShard``) the features are this CP
        rank's rows and the loss is this rank's share (its blocks over the whole batch's weight sum)."""
        gen = batch.extras.get("anchor_generator") if hasattr(batch.extras, "get") else None
        cp = batch.extras.get("cp") if hasattr(batch.extras, "get") else None
        return self.loss(batch.input_ids, features.concat(self.tap_layers), batch.loss_mask, generator=gen,
                         backend=self.attn_backend, cp=cp)

    def anchored_loss(self, input_ids, taps, policy_logits, loss_mask, anchors, anchor_valid) -> torch.Tensor:
        """The loss at given anchors with no host work (repro.rl.draft_graph records it as a CUDA graph);
        ``policy_logits`` is unused (the block drafts share this signature)."""
        return self.loss(input_ids, taps, loss_mask, anchors=anchors, anchor_valid=anchor_valid, attn_impl="padded")

    def loss(self, input_ids, taps, loss_mask, *, anchors=None, anchor_valid=None, generator=None,
             attn_impl: str = "padded", backend: str = "auto", cp: PackedShard | None = None) -> torch.Tensor:
        """Anchors are drawn from the whole batch's ``loss_mask`` (the same on every CP rank); with ``cp``
        only this rank's blocks run (``forward_blocks_cp``) and ``taps`` are its rows ``[T_local, F]``."""
        if anchors is None:
            anchors, anchor_valid = sample_anchors(loss_mask, self.cfg.num_anchors, generator)
        if cp is not None:
            return self._loss_cp(input_ids, taps, loss_mask, anchors, anchor_valid, backend, cp)
        hidden = self.backbone.forward_blocks(input_ids, taps, anchors, anchor_valid, attn_impl, backend)
        logits = self.backbone.head(hidden)                                  # [B, N, Bs, V]
        Bs = self.cfg.block_size
        s = torch.arange(1, Bs, device=input_ids.device)
        tgt_pos = anchors[..., None] + s                                     # [B, N, Bs-1]
        labels = gather_rows(input_ids, tgt_pos)
        w = torch.exp(-(s - 1).to(torch.float64) / self.cfg.decay_gamma).to(logits.dtype)
        m = gather_rows(loss_mask.to(logits.dtype), tgt_pos - 1) * (tgt_pos < input_ids.shape[1])
        wm = w * m * anchor_valid[..., None].to(logits.dtype)
        acc = torch.promote_types(logits.dtype, torch.float32)
        ce = F.cross_entropy(logits[..., 1:, :].to(acc).flatten(0, 2), labels.flatten(), reduction="none")
        wm = wm.to(acc).flatten()
        return (ce * wm).sum() / wm.sum().clamp_min(torch.finfo(acc).tiny)

    def _loss_cp(self, input_ids, taps, loss_mask, anchors, anchor_valid, backend, cp: PackedShard):
        hidden, sel = self.backbone.forward_blocks_cp(input_ids, taps, anchors, anchor_valid, cp, backend)
        logits = self.backbone.head(hidden)                                  # [Nb_local, Bs, V]
        Bs = self.cfg.block_size
        s = torch.arange(1, Bs, device=input_ids.device)
        tgt_pos = anchors[..., None] + s                                     # [B, N, Bs-1], whole batch
        labels = gather_rows(input_ids, tgt_pos)
        w = torch.exp(-(s - 1).to(torch.float64) / self.cfg.decay_gamma).to(logits.dtype)
        m = gather_rows(loss_mask.to(logits.dtype), tgt_pos - 1) * (tgt_pos < input_ids.shape[1])
        acc = torch.promote_types(logits.dtype, torch.float32)
        wm = (w * m * anchor_valid[..., None].to(logits.dtype)).to(acc)      # the normaliser: every block
        ce = F.cross_entropy(logits[:, 1:, :].to(acc).flatten(0, 1), labels[sel].flatten(), reduction="none")
        return (ce * wm[sel].flatten()).sum() / wm.sum().clamp_min(torch.finfo(acc).tiny)

    def sample_block(self, hidden, last_token, *, greedy, temperature, noise=None):
        """Proposals from slots 1..B-1: argmax, or ``sample_with_noise`` with uniform ``noise [B, B-1, V]``."""
        logits = self.backbone.head(hidden[:, 1:]).float()                  # slots 1..B-1
        if greedy:
            return logits.argmax(-1), None
        q = probs_from_logits(logits, temperature)
        return sample_with_noise(q, noise), q

