"""The contract between a pipeline-parallel policy and a draft trained beside it on the last stage.

A draft that satisfies ``TapDraft`` plugs into the PP harness (``repro.parallel``) unchanged: the
harness reads ``draft.tap_layers``, hooks those policy layers on whichever stages own them, ships
the detached features to the last stage through ``kernels.transport.TapChannel`` and calls
``draft.draft_loss(features, batch)`` once per microbatch; the stage adds ``lambda * L_draft`` to
the policy loss. The same contract serves a single-process run (``features_from_hidden_states``).

Tap-index convention (the one place it is defined for the suite):
    tap ``l`` (0-based, ``0 <= l < num_layers``) is the OUTPUT of decoder layer ``l``, i.e. HF
    ``output_hidden_states[l + 1]``; tap ``EMBED_TAP == -1`` is the token embedding, i.e. HF
    ``output_hidden_states[0]`` (the input of layer 0). EAGLE-3's "low/mid/high" taps for Qwen3-8B
    (36 layers) are ``(1, 17, 32)``; DFlash/DSpark's are ``(1, 9, 17, 25, 33)``. A draft written in
    the "input of layer l" convention must subtract one before declaring its taps.

Features are detached (no autograd edge reaches the policy) and laid out ``[batch, seq, hidden]``;
``TargetFeatures.concat()`` joins the layer taps in ascending layer order along the last axis
(``[batch, seq, hidden * n_taps]``), the layout NeMo-RL's ``CapturedStates.hidden_states`` uses.

    python -m repro.parallel.draft_interface      # prints the convention for a 36-layer policy
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

EMBED_TAP = -1  # "output of layer -1": the token embedding (HF hidden_states[0])


@dataclass(frozen=True)
class TargetFeatures:
    """Detached policy features of one microbatch, keyed by tap index (output convention)."""

    hidden: Mapping[int, Tensor]  # tap -> [batch, seq, hidden]; may include EMBED_TAP

    def __post_init__(self) -> None:
        shapes = {tuple(t.shape[:2]) for t in self.hidden.values()}
        if len(shapes) > 1:
            raise ValueError(f"target features disagree on [batch, seq]: {sorted(shapes)}")
        for tap, t in self.hidden.items():
            if t.requires_grad:
                raise ValueError(f"tap {tap} carries an autograd edge; features must be detached")

    @property
    def layers(self) -> tuple[int, ...]:
        """Decoder-layer taps present, ascending (the embedding excluded)."""
        return tuple(sorted(t for t in self.hidden if t != EMBED_TAP))

    @property
    def embeds(self) -> Tensor:
        if EMBED_TAP not in self.hidden:
            raise KeyError("the embedding tap (EMBED_TAP=-1) was not shipped; add it to tap_layers")
        return self.hidden[EMBED_TAP]

    def concat(self, layers: Sequence[int] | None = None) -> Tensor:
        """Layer taps joined along the last axis in ascending layer order: [batch, seq, hidden*n]."""
        layers = self.layers if layers is None else tuple(sorted(layers))
        missing = [t for t in layers if t not in self.hidden]
        if missing:
            raise KeyError(f"taps {missing} were not shipped; present: {sorted(self.hidden)}")
        return torch.cat([self.hidden[t] for t in layers], dim=-1)


@dataclass(frozen=True)
class DraftBatch:
    """What the last stage knows about a microbatch besides the features.

    ``policy_logits`` are the policy's own (detached) next-token logits, the teacher of a
    soft-cross-entropy draft loss; ``loss_mask`` marks positions that count (1) or not (0).
    """

    input_ids: Tensor  # [batch, seq] int64
    loss_mask: Tensor  # [batch, seq] float/bool
    policy_logits: Tensor | None = None  # [batch, seq, vocab], detached
    extras: Mapping[str, Tensor] = field(default_factory=dict)


@runtime_checkable
class TapDraft(Protocol):
    """A draft model trained on target features. Implementations are ``torch.nn.Module``s."""

    tap_layers: tuple[int, ...]  # output convention, EMBED_TAP allowed, strictly ascending

    def draft_loss(self, features: TargetFeatures, batch: DraftBatch) -> Tensor:
        """Scalar draft loss of one microbatch (differentiable w.r.t. the draft's parameters only)."""
        ...


def check_tap_layers(tap_layers: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """Validate a draft's taps against a policy of ``num_layers`` decoder layers; returns them sorted."""
    taps = tuple(int(t) for t in tap_layers)
    if not taps:
        raise ValueError("tap_layers is empty; a draft needs at least one target feature")
    if len(set(taps)) != len(taps):
        raise ValueError(f"tap_layers {list(taps)} has duplicates")
    bad = [t for t in taps if not (t == EMBED_TAP or 0 <= t < num_layers)]
    if bad:
        raise ValueError(f"tap_layers {bad} out of range: expected {EMBED_TAP} (embedding) or "
                         f"0..{num_layers - 1} (output of that decoder layer)")
    return tuple(sorted(taps))


def features_from_hidden_states(hidden_states: Sequence[Tensor], tap_layers: Sequence[int]
                                ) -> TargetFeatures:
    """Build features from HF ``output_hidden_states`` (embedding first, one per layer after)."""
    taps = check_tap_layers(tap_layers, len(hidden_states) - 1)
    return TargetFeatures({t: hidden_states[t + 1].detach() for t in taps})


if __name__ == "__main__":
    n = 36
    print(f"policy with {n} layers: tap l = output of layer l = hidden_states[l+1]; "
          f"EMBED_TAP={EMBED_TAP} = hidden_states[0]")
    print("EAGLE-3 default (1, n/2-1, n-4):", check_tap_layers((1, n // 2 - 1, n - 4), n))
    print("DFlash/DSpark (Qwen3-8B):", check_tap_layers((1, 9, 17, 25, 33), n))
