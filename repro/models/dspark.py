"""DSpark: the block backbone in the anchor-predicts layout, a low-rank Markov head, a confidence head.

Slot s (0..B-1) of the block ``[x_a, MASK x (B-1)]`` predicts ``x_{a+s+1}`` (shared/reference/
draft_families.md section 3). The Markov head adds ``W2(W1[x_prev])`` to the base logits, where the
previous token of slot s is ``x_{a+s}`` (ground truth in training, the sampled draft token at
inference; the anchor for slot 0). The confidence head ``sigmoid(w^T [h_s ; W1[x_prev]] + b)``
predicts the acceptance probability of slot s.

Loss: weights ``w_s = exp(-s/gamma)`` on a contiguous supervised prefix (``cumprod`` of
``a+s+1 < S``, ``loss_mask[a+s]``, block kept); ``0.1 CE + 0.9 TV + 1.0 BCE`` with
``TV = ||p_draft - p_policy||_1`` against the policy's logits at ``a+s`` and the soft confidence
target ``c* = clamp(1 - TV/2, 0, 1)`` (detached); each term normalised by its weight sum.
Inference: one backbone pass, then sequential Markov sampling over the B slots: B proposals; with
``confidence_threshold > 0`` each chain is cut at its first slot whose confidence is below it (the
static schedule; the calibrated, hardware-aware scheduler of the DSpark paper is not implemented).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from repro.decoding.sampling import probs_from_logits, sample_with_noise
from repro.models.block_draft import BlockDraftBackbone, BlockDraftConfig, sample_anchors
from repro.models.dflash import gather_rows
from repro.models.taps import TapSpecFromConfig
from repro.parallel.cp_batch import PackedShard


@dataclass
class DSparkLossWeights:
    ce: float = 0.1
    tv: float = 0.9
    conf: float = 1.0


class DSparkDraft(TapSpecFromConfig, nn.Module):
    """DSpark draft model; satisfies ``repro.parallel.draft_interface.TapDraft`` (after ``attach``)."""

    def __init__(self, cfg: BlockDraftConfig, policy=None, markov_rank: int = 32,
                 loss_weights: DSparkLossWeights | None = None):
        super().__init__()
        if markov_rank < 1:
            raise ValueError(f"markov_rank must be >= 1, got {markov_rank}")
        self.cfg = cfg
        self.loss_weights = loss_weights or DSparkLossWeights()
        self.backbone = BlockDraftBackbone(cfg)
        self.markov_in = nn.Embedding(cfg.vocab_size, markov_rank)              # W1
        self.markov_out = nn.Linear(markov_rank, cfg.vocab_size, bias=False)    # W2
        nn.init.zeros_(self.markov_out.weight)          # starts as the plain backbone
        self.confidence = nn.Linear(cfg.target_hidden + markov_rank, 1)
        self.attn_backend = "auto"        # kernels.attention backend used by draft_loss
        self.confidence_threshold = 0.0   # > 0: cut each chain at the first slot whose confidence is below
        if policy is not None:
            self.attach(policy)

    def attach(self, policy) -> None:
        self.backbone.attach(policy)

    @property
    def num_proposals(self) -> int:
        return self.cfg.block_size

    def draft_loss(self, features, batch) -> torch.Tensor:
        if batch.policy_logits is None:
            raise ValueError("DSpark's loss needs the policy's logits (DraftBatch.policy_logits)")
        gen = batch.extras.get("anchor_generator") if hasattr(batch.extras, "get") else None
        cp = batch.extras.get("cp") if hasattr(batch.extras, "get") else None   # CP: this rank's share
        return self.loss(batch.input_ids, features.concat(self.tap_layers), batch.policy_logits,
                         batch.loss_mask, generator=gen, backend=self.attn_backend, cp=cp)[0]

    def markov_logits(self, base: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        return base + self.markov_out(self.markov_in(prev)).to(base.dtype)

    def conf(self, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        z = torch.cat([hidden, self.markov_in(prev).to(hidden.dtype)], dim=-1)
        return torch.sigmoid(self.confidence(z).squeeze(-1))

    def anchored_loss(self, input_ids, taps, policy_logits, loss_mask, anchors, anchor_valid) -> torch.Tensor:
        """The total loss at given anchors with no host work (repro.rl.draft_graph records it as a CUDA graph)."""
        return self.loss(input_ids, taps, policy_logits, loss_mask, anchors=anchors, anchor_valid=anchor_valid,
                         attn_impl="padded")[0]

    def loss(self, input_ids, taps, policy_logits, loss_mask, *, anchors=None, anchor_valid=None,
             generator=None, attn_impl: str = "padded", backend: str = "auto", cp: PackedShard | None = None):
        """Total loss and its parts ``{"ce", "tv", "conf", "tau"}`` (tau: expected acceptance length).

        With ``cp`` (this rank's ``PackedShard``) ``taps`` and ``policy_logits`` are this rank's rows, only
        its blocks run, and the loss parts are its shares (summed over the group they are the loss;
        ``tau`` is already the group's mean)."""
        Bt, S = input_ids.shape
        if cp is None and policy_logits.shape != (Bt, S, self.cfg.vocab_size):
            raise ValueError(f"policy_logits are {tuple(policy_logits.shape)}, expected {(Bt, S, self.cfg.vocab_size)}")
        if anchors is None:
            anchors, anchor_valid = sample_anchors(loss_mask, self.cfg.num_anchors, generator)
        if cp is not None:
            return self._loss_cp(input_ids, taps, policy_logits, loss_mask, anchors, anchor_valid, backend, cp)
        hidden = self.backbone.forward_blocks(input_ids, taps, anchors, anchor_valid, attn_impl, backend)
        Bs = self.cfg.block_size
        s = torch.arange(Bs, device=input_ids.device)
        pos = anchors[..., None] + s                                           # [B, N, Bs] slot positions
        prev = gather_rows(input_ids, pos)                                     # x_{a+s}
        labels = gather_rows(input_ids, pos + 1)                               # x_{a+s+1}
        acc = torch.promote_types(hidden.dtype, torch.float32)
        logits = self.markov_logits(self.backbone.head(hidden).to(acc), prev)
        teacher = gather_rows(policy_logits.detach().to(acc), pos)             # policy at a+s
        ok = (pos + 1 < S) & gather_rows(loss_mask.bool(), pos, fill=False) & anchor_valid[..., None]
        mask = ok.long().cumprod(-1).to(acc)                                    # contiguous prefix
        w = torch.exp(-s.to(acc) / self.cfg.decay_gamma) * mask
        denom = w.sum().clamp_min(torch.finfo(acc).tiny)
        total, parts, target_c = self._loss_terms(logits, labels, teacher, hidden, prev, w, denom, acc)
        valid = anchor_valid.to(acc)            # a masked mean, not masked_select: no data-dependent shape
        tau = ((target_c * mask).cumprod(-1).sum(-1) + 1) * valid
        parts["tau"] = (tau.sum() / valid.sum().clamp_min(1)).detach()
        return total, parts

    def _loss_cp(self, input_ids, taps, policy_logits, loss_mask, anchors, anchor_valid, backend, cp: PackedShard):
        Bt, S = input_ids.shape
        teacher_rows = policy_logits.reshape(-1, policy_logits.shape[-1])
        if teacher_rows.shape != (cp.num_local, self.cfg.vocab_size):
            raise ValueError(f"policy_logits are {tuple(policy_logits.shape)}, expected this CP rank's rows "
                             f"[{cp.num_local}, {self.cfg.vocab_size}]")
        hidden, sel = self.backbone.forward_blocks_cp(input_ids, taps, anchors, anchor_valid, cp, backend)
        Bs = self.cfg.block_size
        s = torch.arange(Bs, device=input_ids.device)
        pos = anchors[..., None] + s                                           # [B, N, Bs], whole batch
        prev = gather_rows(input_ids, pos)[sel]                                # x_{a+s} of my blocks
        labels = gather_rows(input_ids, pos + 1)[sel]                          # x_{a+s+1}
        acc = torch.promote_types(hidden.dtype, torch.float32)
        logits = self.markov_logits(self.backbone.head(hidden).to(acc), prev)
        rows = torch.arange(Bt, device=input_ids.device)[:, None, None].expand_as(pos)
        teacher = cp.fetch(teacher_rows.to(acc), rows[sel].cpu(), pos[sel].cpu())   # policy at a+s (any rank)
        ok = (pos + 1 < S) & gather_rows(loss_mask.bool(), pos, fill=False) & anchor_valid[..., None]
        mask_all = ok.long().cumprod(-1).to(acc)                                # contiguous prefix
        w_all = torch.exp(-s.to(acc) / self.cfg.decay_gamma) * mask_all
        denom = w_all.sum().clamp_min(torch.finfo(acc).tiny)                    # every block's weight
        w, mask = w_all[sel], mask_all[sel]
        total, parts, target_c = self._loss_terms(logits, labels, teacher.to(logits.device), hidden, prev, w, denom,
                                                  acc)
        tau = cp.all_sum(torch.stack([((target_c * mask).cumprod(-1).sum(-1) + 1).sum(),
                                      torch.tensor(float(mask.shape[0]), dtype=acc, device=mask.device)]))
        parts["tau"] = tau[0] / tau[1]
        return total, parts

    def _loss_terms(self, logits, labels, teacher, hidden, prev, w, denom, acc):
        """CE + total variation to the teacher + the confidence head's BCE, weighted by ``w / denom``;
        returns (total, parts, the confidence targets)."""
        logp = torch.log_softmax(logits, -1)
        ce = -logp.gather(-1, labels[..., None]).squeeze(-1)
        l1 = (logp.exp() - torch.softmax(teacher, -1)).abs().sum(-1)
        target_c = (1 - 0.5 * l1).clamp(0, 1).detach()
        c = self.conf(hidden, prev).to(acc)
        with torch.autocast(c.device.type, enabled=False):   # BCE on probabilities refuses autocast
            bce = F.binary_cross_entropy(c, target_c, reduction="none")
        parts = {"ce": (w * ce).sum() / denom, "tv": (w * l1).sum() / denom, "conf": (w * bce).sum() / denom}
        lw = self.loss_weights
        return lw.ce * parts["ce"] + lw.tv * parts["tv"] + lw.conf * parts["conf"], parts, target_c

    def sample_block(self, hidden, last_token, *, greedy, temperature, noise=None):
        """B chain proposals by sequential Markov sampling (``sample_with_noise`` with uniform ``noise
        [B, Bs, V]``, or argmax); with a confidence threshold also the number of leading proposals to
        verify (static schedule: cut at the first slot with confidence < thr)."""
        base = self.backbone.head(hidden).float()                              # [B, Bs, V]
        prev, toks, qs, confs = last_token, [], [], []
        for s in range(base.shape[1]):
            if self.confidence_threshold > 0:
                confs.append(self.conf(hidden[:, s], prev))
            logits = self.markov_logits(base[:, s], prev)
            if greedy:
                t, q = logits.argmax(-1), None
            else:
                q = probs_from_logits(logits, temperature)
                t = sample_with_noise(q, noise[:, s])
            toks.append(t)
            qs.append(q)
            prev = t
        toks, qs = torch.stack(toks, 1), (None if greedy else torch.stack(qs, 1))
        if self.confidence_threshold > 0:
            keep = (torch.stack(confs, 1) >= self.confidence_threshold).long().cumprod(1)
            return toks, qs, keep.sum(1)
        return toks, qs
