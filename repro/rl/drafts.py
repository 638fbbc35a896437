"""The three draft families as the co-training loop uses them: build, attach, propose, stop the gradient.

``build_draft(spec, policy, mask_token_id)`` returns the family's ``nn.Module`` (``repro.models``)
configured from ``DraftSpec.options``, its taps set on ``policy``. Block drafts (DFlash, DSpark) ride
on the policy's embedding and output head; in the trainer they are attached to
``StopGradParts(policy)``, live views of those weights with the gradient stopped, so the draft loss
is a function of the draft's own parameters only (the paper's ``L_draft(phi; x, sg(H_theta(x)))``)
while always seeing the current head. ``make_proposer`` wraps a draft for the rollout engine.

A spec with ``checkpoint`` (EAGLE-3; ``spec.path`` resolved under checkpoint_root) builds the draft in
the released checkpoint's shape and loads its weights (``integrations.vllm.load``, found through
``repro.core.handoffs``): the run's draft starts warm instead of from a random init, on every process that
builds it. A missing file or a shape that does not fit the policy raises ``ConfigError`` naming the
checkpoint before any weight is copied.

    draft = build_draft(DraftSpec(family="dflash", options={"block_size": 4}), policy, mask_token_id=2)
    proposer = make_proposer(draft, num_proposals=3)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from repro.core.handoffs import draft_loader
from repro.core.specs import ConfigError, DraftSpec
from repro.models.block_draft import BlockDraftConfig, BlockProposer
from repro.models.dflash import DFlashDraft
from repro.models.dspark import DSparkDraft
from repro.models.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Proposer
from repro.models.vocab import build_draft_vocab


class _StopGradEmbedding(nn.Module):
    def __init__(self, src: nn.Embedding):
        super().__init__()
        self._src = [src]                       # a view, not a registered submodule

    @property
    def weight(self) -> torch.Tensor:
        return self._src[0].weight.detach()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class _StopGradLinear(nn.Module):
    def __init__(self, src: nn.Linear):
        super().__init__()
        self._src = [src]

    @property
    def weight(self) -> torch.Tensor:
        return self._src[0].weight.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self._src[0].bias
        return F.linear(x, self.weight, None if b is None else b.detach())


class StopGradParts:
    """The policy's embedding and head as seen by a block draft in the trainer: live, gradient stopped."""

    def __init__(self, policy):
        self.embed_tokens = _StopGradEmbedding(policy.embed_tokens)
        self.lm_head = _StopGradLinear(policy.lm_head)


def build_draft(spec: DraftSpec, policy, *, mask_token_id: int, train: bool = False,
                token_counts: torch.Tensor | None = None) -> nn.Module:
    """The draft of ``spec`` for ``policy`` (taps set on the policy); ``train`` attaches stop-gradient parts. EAGLE-3's
    ``draft_vocab_size`` keeps the top tokens of ``token_counts``, else placeholder maps that a state dict replaces."""
    spec.validate()          # options and proposal count fit the family, before any model exists
    backend = spec.options.get("attn_backend", "auto")
    if spec.family == "eagle3":
        opts = dict(spec.options)
        opts.pop("attn_backend", None)
        if "pass_weights" in opts and opts["pass_weights"] is not None:
            opts["pass_weights"] = tuple(opts["pass_weights"])
        if spec.checkpoint:
            draft = _eagle3_from_checkpoint(spec, policy, opts)
        else:
            cfg = Eagle3Config.from_policy(policy, **opts)
            maps = (None, None) if cfg.draft_vocab_size == cfg.vocab_size else build_draft_vocab(
                torch.zeros(cfg.vocab_size) if token_counts is None else token_counts, cfg.draft_vocab_size)
            draft = Eagle3Draft(cfg, *maps)
            draft.init_from_policy(policy)
    else:
        opts = dict(spec.options)
        opts.pop("attn_backend", None)
        markov_rank = opts.pop("markov_rank", 32)
        num_layers = opts.pop("num_layers", 2)
        cfg = BlockDraftConfig.from_policy(policy, num_layers=num_layers, mask_token_id=mask_token_id, **opts)
        draft = DSparkDraft(cfg, markov_rank=markov_rank) if spec.family == "dspark" else DFlashDraft(cfg)
        draft.attach(StopGradParts(policy) if train else policy)
    draft = draft.to(device=policy.device)
    draft.attn_backend = backend
    policy.set_taps(draft.tap_spec)
    return draft


def _eagle3_from_checkpoint(spec: DraftSpec, policy, opts: dict) -> Eagle3Draft:
    """The EAGLE-3 draft of ``spec.path`` for ``policy`` (its shape and weights), ``opts`` its TTT options."""
    spec.validate()                                  # folder, config.json and weights present
    try:
        return draft_loader(spec.family)(policy, spec.path, **opts)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise ConfigError(f"config draft.checkpoint={spec.checkpoint!r} ({spec.path}) cannot be loaded into "
                          f"the {spec.family} draft of this policy: {msg}") from exc


def trainable_parameters(draft: nn.Module) -> list[nn.Parameter]:
    return [p for p in draft.parameters() if p.requires_grad]


def make_proposer(draft: nn.Module, num_proposals: int):
    """The rollout engine's proposer for ``draft`` (EAGLE-3: k chained passes; block drafts: one block)."""
    if isinstance(draft, Eagle3Draft):
        return Eagle3Proposer(draft, num_proposals)
    if num_proposals != draft.num_proposals:
        raise ConfigError(f"num_proposals={num_proposals} is invalid for a block draft whose block gives "
                          f"{draft.num_proposals} proposals")
    return BlockProposer(draft)
