"""Target-feature taps: which policy layers feed a draft, in which index convention, and hooks that grab them.

Two conventions name the same hidden states differently, and mixing them shifts every tap by one
layer (shared/reference/draft_families.md, section 0):

* ``"output"``: tap ``l`` is the output of decoder layer ``l`` (0-based), i.e. HF
  ``hidden_states[l + 1]``. SpecForge, DFlash, DeepSpec and NeMo-RL's hooks use it.
* ``"input"``: tap ``l`` is the input of decoder layer ``l``, i.e. HF ``hidden_states[l]``
  (``l = 0`` is the embedding output). The original EAGLE code and vLLM's
  ``eagle_aux_hidden_state_layer_ids`` use it.

``TapSpec`` stores the layers in the convention they were given in and converts explicitly;
``TapRecorder`` registers forward hooks (output convention) or forward pre-hooks (input convention)
on the decoder layers, so the hooked tensor is exactly the one the convention names. Taps are
detached: a draft loss never reaches the policy.

    spec = TapSpec.eagle3_default(num_layers=36)          # [1, 17, 32] in the output convention
    spec.as_output_layers()                                # (1, 17, 32)
    TapSpec((2, 18, 33), "input", 36).as_output_layers()   # the same taps, given as vLLM names them
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

Convention = Literal["output", "input"]
CONVENTIONS = ("output", "input")


@dataclass(frozen=True)
class TapSpec:
    """Tap layers of a policy with ``num_layers`` decoder layers, in a named convention."""

    layers: tuple[int, ...]
    convention: Convention
    num_layers: int

    def __post_init__(self) -> None:
        if self.convention not in CONVENTIONS:
            raise ValueError(f"tap convention {self.convention!r} is not one of {CONVENTIONS}")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if not self.layers:
            raise ValueError("a TapSpec needs at least one tap layer")
        object.__setattr__(self, "layers", tuple(int(l) for l in self.layers))
        # output of layer l exists for 0 <= l < N; input of layer l for 0 <= l < N (input of l=0 is
        # the embedding); the final norm's output is not a tap in either convention.
        for l in self.layers:
            if not 0 <= l < self.num_layers:
                raise ValueError(f"tap layer {l} ({self.convention} convention) is out of range: "
                                 f"the policy has {self.num_layers} decoder layers, expected 0 <= l < "
                                 f"{self.num_layers}")
        if len(set(self.layers)) != len(self.layers):
            raise ValueError(f"tap layers {self.layers} repeat a layer")

    def as_output_layers(self) -> tuple[int, ...]:
        """The taps as "output of layer l" indices (input of layer l == output of layer l-1)."""
        if self.convention == "output":
            return self.layers
        if 0 in self.layers:
            raise ValueError("input-convention tap 0 is the embedding output, which has no "
                             "output-convention name; keep it in the input convention")
        return tuple(l - 1 for l in self.layers)

    def as_input_layers(self) -> tuple[int, ...]:
        """The taps as "input of layer l" indices."""
        if self.convention == "input":
            return self.layers
        if self.num_layers - 1 in self.layers:
            raise ValueError(f"output of the last layer ({self.num_layers - 1}) is the input of no "
                             "decoder layer; keep it in the output convention")
        return tuple(l + 1 for l in self.layers)

    def hf_hidden_state_indices(self) -> tuple[int, ...]:
        """Indices into HF ``output_hidden_states`` (which is ``[embeddings, out_0, ..., norm(out_N-1)]``)."""
        return self.layers if self.convention == "input" else tuple(l + 1 for l in self.layers)

    # -- the families' defaults ------------------------------------------------------------------------
    @classmethod
    def eagle3_default(cls, num_layers: int) -> TapSpec:
        """EAGLE-3 low/mid/high taps ``[1, N//2-1, N-4]`` (output convention; == input ``[2, N//2, N-3]``)."""
        if num_layers < 5:
            raise ValueError(f"EAGLE-3 default taps need >= 5 policy layers, got {num_layers}")
        return cls((1, num_layers // 2 - 1, num_layers - 4), "output", num_layers)

    @classmethod
    def dflash_default(cls, num_layers: int, num_draft_layers: int) -> TapSpec:
        """DFlash/DSpark taps: ``num_draft_layers`` layers evenly from 1 to N-3, rounded (output convention)."""
        if num_draft_layers < 1:
            raise ValueError(f"num_draft_layers must be >= 1, got {num_draft_layers}")
        if num_layers < 4:
            raise ValueError(f"DFlash default taps need >= 4 policy layers, got {num_layers}")
        if num_draft_layers == 1:
            return cls((num_layers // 2,), "output", num_layers)
        start, end = 1, num_layers - 3
        span = end - start
        ids = [round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]
        return cls(tuple(ids), "output", num_layers)


class TapSpecFromConfig:
    """The tap half of the TapDraft contract for a draft whose ``cfg`` carries its ``tap_spec``."""

    @property
    def tap_spec(self) -> TapSpec:
        return self.cfg.tap_spec

    @property
    def tap_layers(self) -> tuple[int, ...]:
        """Policy layers whose outputs the draft reads (the output-of-layer convention), sorted."""
        return tuple(sorted(self.cfg.tap_spec.as_output_layers()))


class TapRecorder:
    """Forward hooks on a decoder-layer list that record the tap tensors of one forward.

    Use ``with recorder.capture() as taps:`` around a policy forward; afterwards ``taps`` is the list
    of detached tensors ``[B, T, H]`` in ``spec.layers`` order. Outside ``capture()`` the hooks are
    inert, so the policy runs at full speed when no draft needs features.
    """

    def __init__(self, layers: nn.ModuleList, spec: TapSpec):
        if len(layers) != spec.num_layers:
            raise ValueError(f"TapSpec is for {spec.num_layers} layers but the policy has {len(layers)}")
        self.spec = spec
        self._active: dict[int, torch.Tensor] | None = None
        self._handles = []
        for l in spec.layers:
            if spec.convention == "output":
                h = layers[l].register_forward_hook(self._make_out_hook(l))
            else:
                h = layers[l].register_forward_pre_hook(self._make_in_hook(l), with_kwargs=True)
            self._handles.append(h)

    def _make_out_hook(self, l: int):
        def hook(_mod, _args, output):
            if self._active is not None:
                out = output[0] if isinstance(output, (tuple, list)) else output
                self._active[l] = out.detach()
        return hook

    def _make_in_hook(self, l: int):
        def hook(_mod, args, kwargs):
            if self._active is not None:
                x = args[0] if args else kwargs["hidden_states"]
                self._active[l] = x.detach()
        return hook

    class _Capture:
        def __init__(self, rec: TapRecorder):
            self.rec, self.taps = rec, []

        def __enter__(self) -> list[torch.Tensor]:
            if self.rec._active is not None:
                raise RuntimeError("TapRecorder.capture() is not re-entrant")
            self.rec._active = {}
            return self.taps

        def __exit__(self, exc_type, exc, tb) -> None:
            got, self.rec._active = self.rec._active, None
            if exc_type is None:
                missing = [l for l in self.rec.spec.layers if l not in got]
                if missing:
                    raise RuntimeError(f"tap layers {missing} did not run in this forward")
                self.taps.extend(got[l] for l in self.rec.spec.layers)

    def capture(self) -> TapRecorder._Capture:
        return TapRecorder._Capture(self)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

