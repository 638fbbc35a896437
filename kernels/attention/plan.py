"""Ring schedules: which query rows meet which key rows, under which mask, at each ring step.

At ring step s rank r holds the K/V of rank j = (r - s) mod C. A ``RingPlan`` gives three cases:

    diag   (s = 0, own K/V)   zigzag/sequential: causal (trunk) or per-query prefix (blocks)
    lower  (j < r)            zigzag: all queries x front-half keys;   sequential: all x all
    upper  (j > r)            zigzag: back-half queries x all keys;   sequential: nothing

Every zigzag step after the first costs exactly half a block, so work per rank is equal.
The causal (trunk) plan selects the halves without gathering rows: a document's front and back
chunks are contiguous local rows, so each document becomes two segments of the step's MaskSpec, one
of them empty (lower: the back-half keys that no query sees; upper: the front-half queries that see
no key, out = 0 and lse = -inf, which the LSE merge leaves unchanged). Block plans gather their rows.

    plan = causal_plan(layout, device)                       # EAGLE-3 trunk (queries = trunk rows)
    plan = prefix_plan(layout, doc, key_end, is_back, valid, device)   # DFlash/DSpark blocks
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.attention.layout import Layout
from kernels.attention.spec import MaskSpec
from kernels.attention.staging import to_device


@dataclass(frozen=True, eq=False)
class StepPlan:
    q_rows: torch.Tensor | None     # None: all query rows
    k_rows: torch.Tensor | None     # None: all key rows of the held K/V
    spec: MaskSpec

    def pairs(self) -> int:
        return self.spec.pairs()


@dataclass(frozen=True, eq=False)
class RingPlan:
    cp_size: int
    rank: int
    diag: StepPlan | None
    lower: StepPlan | None
    upper: StepPlan | None

    def for_step(self, step: int) -> StepPlan | None:
        if step == 0:
            return self.diag
        src = (self.rank - step) % self.cp_size
        return self.lower if src < self.rank else self.upper

    def pairs_per_step(self) -> list[int]:
        return [p.pairs() if (p := self.for_step(s)) is not None else 0 for s in range(self.cp_size)]


def _cu_from_docs(doc: torch.Tensor, num_docs: int) -> torch.Tensor:
    counts = torch.bincount(doc, minlength=num_docs)
    return torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])


def _two_per_doc(first_end: torch.Tensor, second_end: torch.Tensor) -> torch.Tensor:
    """Boundaries [0, first_end[0], second_end[0], first_end[1], ...] of two segments per document."""
    return torch.cat([torch.zeros(1, dtype=torch.int64), torch.stack([first_end, second_end], 1).flatten()])


def causal_plan(layout: Layout, device=None) -> RingPlan:
    """Causal main-sequence attention; queries are the local trunk rows (every step sees all of them)."""
    diag = StepPlan(None, None, MaskSpec.causal(layout.cu_local))
    lower = upper = None
    if layout.cp_size > 1 and layout.scheme == "zigzag":
        start, end = layout.cu_local[:-1], layout.cu_local[1:]
        mid = start + layout.chunk                  # end of each document's front chunk
        lower = StepPlan(None, None, MaskSpec.full(_two_per_doc(end, end), _two_per_doc(mid, end)))
        upper = StepPlan(None, None, MaskSpec.full(_two_per_doc(mid, end), _two_per_doc(start, end)))
    elif layout.cp_size > 1:
        lower = StepPlan(None, None, MaskSpec.full(layout.cu_local, layout.cu_local))
    return RingPlan(layout.cp_size, layout.rank, diag, lower, upper)


def prefix_plan(layout: Layout, doc: torch.Tensor, key_end: torch.Tensor, is_back: torch.Tensor,
                valid: torch.Tensor, device=None) -> RingPlan:
    """Block queries (rows sorted by document) that see the trunk strictly before their anchor.

    ``doc``, ``key_end`` (exclusive, local key row), ``is_back`` and ``valid`` are per query row.
    Invalid rows take part in no step (out 0, lse -inf).
    """
    if doc.numel() > 1 and bool((doc[1:] < doc[:-1]).any()):
        raise ValueError("block query rows must be sorted by document")
    S = layout.num_docs
    rows = torch.nonzero(valid.cpu()).flatten()
    cu_q = _cu_from_docs(doc[rows], S)
    mv = lambda t: to_device(t, device) if device is not None else t
    diag = StepPlan(mv(rows), None, MaskSpec.prefix(cu_q, layout.cu_local, key_end.cpu()[rows]))
    lower = upper = None
    if layout.cp_size > 1 and layout.scheme == "zigzag":
        lower = StepPlan(mv(rows), mv(layout.front_rows), MaskSpec.full(cu_q, layout.cu_half))
        brows = rows[is_back.cpu()[rows]]
        upper = StepPlan(mv(brows), None, MaskSpec.full(_cu_from_docs(doc[brows], S), layout.cu_local))
    elif layout.cp_size > 1:
        lower = StepPlan(mv(rows), None, MaskSpec.full(cu_q, layout.cu_local))
    return RingPlan(layout.cp_size, layout.rank, diag, lower, upper)
