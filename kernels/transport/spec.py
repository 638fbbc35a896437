"""What a TapChannel carries and how both sides name it: tap specs, the channel layout, sequence
stamps and the channel's errors. Pure Python, no communication; validated before any setup.

A *ring* is one (source stage, tap) pair; it owns ``ring_depth`` slots of static shape
``TapSpec.max_shape`` on the draft's (consumer's) side. Only dim 0 may vary per message; the slot's
length field says how many rows of dim 0 are valid. Stamps are derived independently on both sides:
``seq = step * n_microbatches + microbatch``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float64: 3,
               torch.int64: 4, torch.int32: 5, torch.uint8: 6}


class TapChannelError(RuntimeError):
    """Base class of every TapChannel failure."""


class StampMismatchError(TapChannelError):
    """A slot holds a sequence stamp other than the one this side derived."""


class TapTimeoutError(TapChannelError, TimeoutError):
    """A get (waiting for a stamp) or a put (waiting for credit) ran past its timeout."""


class PeerDiedError(TapChannelError):
    """The process on the other side of a ring exited while this side waited on it."""


@dataclass(frozen=True)
class TapSpec:
    """One tap: a name, the largest shape it can take (dim 0 varies up to ``max_shape[0]``), a dtype."""

    name: str
    max_shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"tap name {self.name!r}: expected a non-empty name without '/'")
        if not self.max_shape or any(int(d) <= 0 for d in self.max_shape):
            raise ValueError(f"tap {self.name!r}: max_shape {self.max_shape} must be non-empty and positive")
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"tap {self.name!r}: dtype {self.dtype} not supported; expected one of "
                             f"{sorted(map(str, DTYPE_CODES))}")
        object.__setattr__(self, "max_shape", tuple(int(d) for d in self.max_shape))

    @property
    def row_numel(self) -> int:
        n = 1
        for d in self.max_shape[1:]:
            n *= d
        return n

    @property
    def max_numel(self) -> int:
        return self.max_shape[0] * self.row_numel

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def max_nbytes(self) -> int:
        return self.max_numel * self.itemsize

    def check(self, tensor: torch.Tensor, where: str) -> int:
        """Validate a tensor about to be put; returns its length (dim 0)."""
        if tensor.dtype != self.dtype:
            raise ValueError(f"{where}: tap {self.name!r} got dtype {tensor.dtype}, expected {self.dtype}")
        if tuple(tensor.shape[1:]) != self.max_shape[1:] or tensor.dim() != len(self.max_shape):
            raise ValueError(f"{where}: tap {self.name!r} got shape {tuple(tensor.shape)}, expected "
                             f"(n, {', '.join(map(str, self.max_shape[1:]))}) with n <= {self.max_shape[0]}")
        if not 0 < tensor.shape[0] <= self.max_shape[0]:
            raise ValueError(f"{where}: tap {self.name!r} length {tensor.shape[0]} outside "
                             f"1..{self.max_shape[0]}")
        return int(tensor.shape[0])


@dataclass(frozen=True)
class RingId:
    index: int
    stage: int
    tap: TapSpec
    source_rank: int


@dataclass(frozen=True)
class ChannelLayout:
    """Who sends what to whom. Identical on every rank; checked before any communication.

    ``sources``: source stage -> its taps. ``stage_to_rank``: pipeline stage -> global rank that runs
    it (several stages may share a rank under interleaved/V schedules). ``consumer_rank``: the draft's
    rank, owner of every ring. ``ring_depth``: slots per ring (>= how far a source runs ahead).
    """

    sources: Mapping[int, Sequence[TapSpec]]
    stage_to_rank: Mapping[int, int]
    consumer_rank: int
    ring_depth: int
    rings: tuple[RingId, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.ring_depth < 1:
            raise ValueError(f"ring_depth={self.ring_depth}: expected >= 1")
        if not self.sources:
            raise ValueError("ChannelLayout needs at least one source stage")
        rings = []
        for stage in sorted(self.sources):
            if stage not in self.stage_to_rank:
                raise ValueError(f"source stage {stage} has no rank in stage_to_rank "
                                 f"{dict(self.stage_to_rank)}")
            names = [t.name for t in self.sources[stage]]
            if len(set(names)) != len(names):
                raise ValueError(f"source stage {stage} declares duplicate tap names {names}")
            if not names:
                raise ValueError(f"source stage {stage} declares no taps")
            for tap in self.sources[stage]:
                rings.append(RingId(len(rings), stage, tap, int(self.stage_to_rank[stage])))
        object.__setattr__(self, "rings", tuple(rings))
        object.__setattr__(self, "_index", {(r.stage, r.tap.name): r for r in rings})

    @property
    def ranks(self) -> set[int]:
        return {self.consumer_rank, *(r.source_rank for r in self.rings)}

    def ring(self, stage: int, name: str) -> RingId:
        try:
            return self._index[(stage, name)]
        except KeyError:
            known = sorted(self._index)
            raise KeyError(f"no ring for source stage {stage}, tap {name!r}; known (stage, tap): "
                           f"{known}") from None

    def rings_of_stage(self, stage: int) -> list[RingId]:
        if stage not in self.sources:
            raise KeyError(f"stage {stage} is not a source stage; sources: {sorted(self.sources)}")
        return [r for r in self.rings if r.stage == stage]


def sequence_stamp(step: int, microbatch: int, n_microbatches: int) -> int:
    """The stamp both sides derive for (step, microbatch): ``step * n_microbatches + microbatch``."""
    if n_microbatches < 1:
        raise ValueError(f"n_microbatches={n_microbatches}: expected >= 1")
    if step < 0 or not 0 <= microbatch < n_microbatches:
        raise ValueError(f"(step={step}, microbatch={microbatch}) outside step >= 0, "
                         f"0 <= microbatch < {n_microbatches}")
    return step * n_microbatches + microbatch
