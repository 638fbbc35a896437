"""The contract between the rollout engine and a draft's proposal procedure (one per draft family).

Per verify step the engine calls ``propose`` once and then ``observe`` once:

* ``observe(next_tokens, taps, positions, valid)`` hands the draft the policy's features of the
  tokens the policy has just processed and *kept*: feature ``h_j`` at position ``j`` (from the tap
  layers) together with the committed token ``x_{j+1}`` that follows it. Ragged rows are padded;
  ``valid [B, c]`` says which columns are real. The first call carries the prompt (prefill); later
  calls carry the accepted prefix of the last verify step plus the policy's extra token.
* ``propose(last_token, last_pos)`` returns ``k`` chain proposals for positions ``last_pos+1 ..
  last_pos+k``, where ``last_token`` (at ``last_pos``) is the newest committed token, which the
  policy has not processed yet; plus the distributions they were drawn from (target vocabulary),
  or ``None`` for deterministic (greedy) proposals; optionally a third value ``num_valid [B]`` when
  the draft cuts some rows' chains short (only the leading ``num_valid`` proposals are verified).
* ``select(rows)`` keeps only the given batch rows (finished rows leave the batch).
* ``reset(batch)`` starts a request on growing caches (``cuda_graphs="off"``). A proposer with a
  static-cache path also has ``prepare(batch, max_slots, *, cuda_graphs)``, which the engine calls
  instead under ``cuda_graphs="draft"``: caches preallocated for ``max_slots`` columns per row (the
  engine sizes it from the request, ``repro.decoding.static_kv.slots_needed``), the per-verify-step
  ``observe`` (fixed width k+1) and ``propose`` replayed as CUDA graphs when ``cuda_graphs`` is True
  (a GPU), eager otherwise; and ``graph_status()`` (captures, replays, fallback reasons). Under
  ``cuda_graphs="all"`` the engine keeps every row in the batch to the end (no ``select``) and sets the
  proposer's ``check_steps = False`` (its per-step host-side check would be a second device sync).
* Sampled proposals draw uniform noise from the engine's ``generator`` (``sampling.proposal_noise``)
  and pick by ``sampling.sample_with_noise``, so graphed and eager paths give the same tokens.

An oracle proposer (tests) and the three drafts (``repro.models.{eagle3,dflash,dspark}``) implement it.
"""
from __future__ import annotations

from typing import Protocol

import torch


class Proposer(Protocol):
    num_proposals: int
    needs_taps: bool

    def reset(self, batch: int) -> None: ...

    def observe(self, next_tokens: torch.Tensor, taps: list[torch.Tensor] | None, positions: torch.Tensor,
                valid: torch.Tensor) -> None: ...

    def propose(self, last_token: torch.Tensor, last_pos: torch.Tensor, *, greedy: bool, temperature: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def select(self, rows: torch.Tensor) -> None: ...

