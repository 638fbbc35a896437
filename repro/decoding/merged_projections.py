"""Merged projection weights for decoding: a decoder layer's q/k/v projections as one matrix product, gate/up as one.

At decode sizes (a few rows) each projection is a latency-bound matrix-vector product, so one product over the
stacked weights costs about what one of its parts does (docs/engine.md). Inside ``merged_projections(model)`` the
first projection of a group computes the whole group's product over the stacked weights and the others return their
slices of it (HF's attention calls q, k and v on one input, its MLP gate and up); a call on another input falls
back to the member's own weight. The members become subclasses of ``nn.Linear`` for the block (the same classes in
every layer, the stack a buffer of the first member), so one compiled decoder layer still serves every layer. The
first entry stacks the weights and makes each member's parameter a view of its rows of the stack, so there is no
second copy and a weight push or an optimizer step (in place) updates the stack that captured CUDA graphs read;
a parameter given other storage (``.to()``) is stacked again on the next entry. Every product inside the block,
the layers' other projections (o, down) and the head included, is ``decode_linear``: up to 16 rows on a GPU run the
Triton matrix-vector kernels (``repro.decoding.decode_linear``), and a SiLU-gated MLP (``GATED_MLPS``) computes
``silu(gate) * up`` in the same call as its merged product. Outside the block the model's modules are their own;
only their parameters' storage is shared.

    with merged_projections(policy.model):
        out = policy.decode_step_static(...)
"""
from __future__ import annotations

import contextlib
import weakref

import torch
from torch import nn

from repro.decoding.decode_linear import DecodeLinear, decode_linear, silu_gated

GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))
SINGLES = (("self_attn", "o_proj"), ("mlp", "down_proj"))
# MLP classes whose forward is down(act(gate(x)) * up(x)): with a SiLU act and merged gate/up without bias, their
# gate and up products and the gate run as one call (silu_gated)
GATED_MLPS = ("Qwen3MLP", "Qwen2MLP", "LlamaMLP", "MistralMLP")
SILU_ACTS = ("SiLUActivation", "SiLU")


class _Stash:
    """The last group product: (input, output); one object for every layer (a compiled layer guards on it)."""
    x: torch.Tensor | None = None
    y: torch.Tensor | None = None


STASH = _Stash()


class MergedFirst(nn.Linear):
    """A group's first member: the whole group's product, its own columns returned, the product stashed."""
    merged_size: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = decode_linear(x, self.merged_weight, self.merged_bias)
        STASH.x, STASH.y = x, y
        return y[..., : self.merged_size]


class MergedPart(nn.Linear):
    """A later member: its columns of the stashed product when called on the same input, else its own product."""
    merged_start: int
    merged_size: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if STASH.x is not x:
            return decode_linear(x, self.weight, self.bias)
        return STASH.y[..., self.merged_start: self.merged_start + self.merged_size]


class GatedMLPForward:
    """The forward a gated MLP takes inside the block: ``down(silu_gated(x, [gate; up]))``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_gated(x, self.gate_proj.merged_weight))


_GATED: dict[type, type] = {}


def set_class(module: nn.Module, cls: type) -> None:
    """``module.__class__ = cls`` past ``nn.Module.__setattr__`` (its parameter and buffer checks do not apply to
    ``__class__``; an engine enters and leaves the block once per request, for every projection of the model)."""
    object.__setattr__(module, "__class__", cls)


def gated_class(cls: type) -> type:
    """``cls`` with ``GatedMLPForward``'s forward (one subclass per class, so one compiled layer serves all)."""
    if cls not in _GATED:
        _GATED[cls] = type(f"Gated{cls.__name__}", (GatedMLPForward, cls), {})
    return _GATED[cls]


class _Group:
    def __init__(self, members: list[nn.Linear]):
        self.members = members
        self.bias = all(m.bias is not None for m in members)
        self.weight = self.stacked_bias = None

    def _views(self, stacked: torch.Tensor | None, name: str) -> bool:
        """Whether every member's ``name`` tensor is its slice of ``stacked``."""
        if stacked is None:
            return False
        row_bytes = stacked.stride(0) * stacked.element_size()
        at = stacked.data_ptr()
        for m in self.members:
            t = getattr(m, name)
            if t.dtype != stacked.dtype or t.device != stacked.device or t.data_ptr() != at:
                return False
            at += t.shape[0] * row_bytes
        return True

    def sync(self) -> None:
        """Stack the members' weights once and make each member's parameter its slice of the stack: no second copy,
        and whatever writes a parameter in place (a weight push, an optimizer step) writes the stack. Done again
        when a parameter no longer is its slice (``.to()`` or an assignment gave it other storage)."""
        if self._views(self.weight, "weight") and (not self.bias or self._views(self.stacked_bias, "bias")):
            return
        with torch.no_grad():
            self.weight = torch.cat([m.weight.detach() for m in self.members])
            self.stacked_bias = torch.cat([m.bias.detach() for m in self.members]) if self.bias else None
            off = 0
            for m in self.members:
                n = m.weight.shape[0]
                m.weight.data = self.weight[off:off + n]
                if self.bias:
                    m.bias.data = self.stacked_bias[off:off + n]
                off += n

    def enter(self) -> None:
        self.sync()
        start = 0
        for i, m in enumerate(self.members):
            set_class(m, MergedFirst if i == 0 else MergedPart)
            vars(m).update(merged_start=start, merged_size=m.out_features)
            start += m.out_features
        first = self.members[0]
        first._buffers["merged_weight"] = self.weight       # non-persistent buffers (register_buffer's checks
        first._buffers["merged_bias"] = self.stacked_bias   # cost more than the rest of an entry)
        first._non_persistent_buffers_set.update(("merged_weight", "merged_bias"))

    def exit(self) -> None:
        for m in self.members:
            set_class(m, nn.Linear)
            for name in ("merged_weight", "merged_bias"):
                m._buffers.pop(name, None)
                m._non_persistent_buffers_set.discard(name)
            for name in ("merged_start", "merged_size"):
                vars(m).pop(name, None)


class MergedProjections:
    """The groups of one model's decoder layers (those whose members are all plain ``nn.Linear`` of one input), and
    the plain ``nn.Linear`` projections outside them (o, down, the head), which become ``DecodeLinear``."""

    def __init__(self, model: nn.Module):
        self.groups: list[_Group] = []
        self.singles: list[nn.Linear] = []
        self.gated: list[tuple[nn.Module, type]] = []     # (a gated MLP, its own class)
        for layer in model.model.layers:
            for parent_name, names in GROUPS:
                parent = getattr(layer, parent_name, None)
                members = [getattr(parent, n, None) for n in names]
                if all(type(m) is nn.Linear for m in members) and len({m.in_features for m in members}) == 1:
                    self.groups.append(_Group(members))
                    if (parent_name == "mlp" and type(parent).__name__ in GATED_MLPS
                            and all(m.bias is None for m in members)
                            and type(getattr(parent, "act_fn", None)).__name__ in SILU_ACTS
                            and type(getattr(parent, "down_proj", None)) is nn.Linear):
                        self.gated.append((parent, type(parent)))
            for parent_name, name in SINGLES:
                m = getattr(getattr(layer, parent_name, None), name, None)
                if type(m) is nn.Linear:
                    self.singles.append(m)
        if type(getattr(model, "lm_head", None)) is nn.Linear:
            self.singles.append(model.lm_head)
        self.depth = 0

    @contextlib.contextmanager
    def active(self):
        if self.depth == 0:
            for g in self.groups:
                g.enter()
            for m in self.singles:
                set_class(m, DecodeLinear)
            for mlp, cls in self.gated:
                set_class(mlp, gated_class(cls))
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                STASH.x = STASH.y = None
                for g in self.groups:
                    g.exit()
                for m in self.singles:
                    set_class(m, nn.Linear)
                for mlp, cls in self.gated:
                    set_class(mlp, cls)


_BY_MODEL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def merged_projections(model: nn.Module):
    """``model``'s merged projections as a context manager (one set of stacked weights per model)."""
    if model not in _BY_MODEL:
        _BY_MODEL[model] = MergedProjections(model)
    return _BY_MODEL[model].active()
