"""Merged projection weights for decoding: a decoder layer's q/k/v projections as one matrix product, gate/up as one.

At decode sizes (a few rows) each projection is a latency-bound matrix-vector product, so one product over the
stacked weights costs about what one of its parts does (docs/engine.md). Inside ``merged_projections(model)`` the
first projection of a group computes the whole group's product over a stacked copy of the weights and the others
return their slices of it (HF's attention calls q, k and v on one input, its MLP gate and up); a call on another
input falls back to the member's own weight. The members become subclasses of ``nn.Linear`` for the block (the
same classes in every layer, the stacked copy a buffer of the first member), so one compiled decoder layer still
serves every layer. The stacked copies are refreshed on entry when a source weight changed (its version counter or
storage: a weight push or an optimizer step between requests), in place, so CUDA graphs captured over them stay
valid. Outside the block the model is its own.

    with merged_projections(policy.model):
        out = policy.decode_step_static(...)
"""
from __future__ import annotations

import contextlib
import weakref

import torch
import torch.nn.functional as F
from torch import nn

GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


class _Stash:
    """The last group product: (input, output); one object for every layer (a compiled layer guards on it)."""
    x: torch.Tensor | None = None
    y: torch.Tensor | None = None


STASH = _Stash()


class MergedFirst(nn.Linear):
    """A group's first member: the whole group's product, its own columns returned, the product stashed."""
    merged_size: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.merged_weight, self.merged_bias)
        STASH.x, STASH.y = x, y
        return y[..., : self.merged_size]


class MergedPart(nn.Linear):
    """A later member: its columns of the stashed product when called on the same input, else its own product."""
    merged_start: int
    merged_size: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if STASH.x is not x:
            return F.linear(x, self.weight, self.bias)
        return STASH.y[..., self.merged_start: self.merged_start + self.merged_size]


class _Group:
    def __init__(self, members: list[nn.Linear]):
        self.members = members
        self.bias = all(m.bias is not None for m in members)
        self.weight = self.stacked_bias = None
        self.seen: tuple = ()

    def sync(self) -> None:
        """The stacked copy of the members' current weights (rebuilt on a dtype or device change, else in place)."""
        ws = [m.weight for m in self.members]
        state = tuple((w._version, w.data_ptr(), w.dtype, w.device) for w in ws)
        if state == self.seen:
            return
        with torch.no_grad():
            biases = [m.bias for m in self.members] if self.bias else None
            if self.weight is None or self.weight.dtype != ws[0].dtype or self.weight.device != ws[0].device:
                self.weight = torch.cat(ws).detach()
                self.stacked_bias = torch.cat(biases).detach() if biases else None
            else:
                torch.cat(ws, out=self.weight)
                if biases:
                    torch.cat(biases, out=self.stacked_bias)
        self.seen = state

    def enter(self) -> None:
        self.sync()
        start = 0
        for i, m in enumerate(self.members):
            m.__class__ = MergedFirst if i == 0 else MergedPart
            m.merged_start, m.merged_size = start, m.out_features
            start += m.out_features
        first = self.members[0]
        first.register_buffer("merged_weight", self.weight, persistent=False)
        first.register_buffer("merged_bias", self.stacked_bias, persistent=False)

    def exit(self) -> None:
        for m in self.members:
            m.__class__ = nn.Linear
            for name in ("merged_weight", "merged_bias"):
                m._buffers.pop(name, None)
            for name in ("merged_start", "merged_size"):
                vars(m).pop(name, None)


class MergedProjections:
    """The groups of one model's decoder layers: those whose members are all plain ``nn.Linear`` of one input."""

    def __init__(self, model: nn.Module):
        self.groups: list[_Group] = []
        for layer in model.model.layers:
            for parent_name, names in GROUPS:
                parent = getattr(layer, parent_name, None)
                members = [getattr(parent, n, None) for n in names]
                if all(type(m) is nn.Linear for m in members) and len({m.in_features for m in members}) == 1:
                    self.groups.append(_Group(members))
        self.depth = 0

    @contextlib.contextmanager
    def active(self):
        if self.depth == 0:
            for g in self.groups:
                g.enter()
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                STASH.x = STASH.y = None
                for g in self.groups:
                    g.exit()


_BY_MODEL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def merged_projections(model: nn.Module):
    """``model``'s merged projections as a context manager (one set of stacked weights per model)."""
    if model not in _BY_MODEL:
        _BY_MODEL[model] = MergedProjections(model)
    return _BY_MODEL[model].active()
