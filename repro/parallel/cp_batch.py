"""A right-padded microbatch packed into one stream and sharded zigzag over a context-parallel group.

``PackedShard`` is what the policy and the draft of one CP rank share about a microbatch
``[B, S]`` whose row ``b`` holds ``lengths[b]`` real tokens: the real tokens of every row are packed
back to back (row ``b`` is document ``b``; padding never enters), an optional *filler* document at
the end brings the stream to a fixed padded length (so every microbatch of a step has the same
number of local rows, as a static-shape pipeline schedule needs), and ``kernels.attention``'s zigzag
layout cuts it over the group (rank r holds chunks r and 2C-1-r of every document).

Each local row knows its grid position ``(b, t)``; both are -1 on zigzag padding and filler rows.
Global per-row tensors (ids, masks: cheap, every rank holds them) are read at local rows with
``local``/``at``. Per-row tensors that only exist sharded (the policy's logits, taps) are read at
arbitrary grid positions with ``fetch``, which moves only the rows other ranks hold (one
``all_to_all`` round for the requests, one for the rows; detached, no autograd).

    shard = PackedShard.build(lengths, S, group)              # group None -> one rank
    ids_local = shard.local(input_ids)                        # [T_local]
    teacher = shard.fetch(logits_local, b, t + 1)             # rows of the next positions
    python -m pytest -q tests/models/test_draft_cp.py
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from kernels.attention import Layout, make_layout
from kernels.attention.layout import group_rank_size


def padded_length(lengths: torch.Tensor, cp_size: int) -> int:
    """Tokens of the packed stream once every document is padded for zigzag (multiple of 2C)."""
    mult = 1 if cp_size == 1 else 2 * cp_size
    return int(((lengths.long() + mult - 1) // mult * mult).sum())


@dataclass(frozen=True, eq=False)
class PackedShard:
    """This CP rank's rows of a packed microbatch; build with ``PackedShard.build``."""

    layout: Layout
    group: object                 # ProcessGroup or None (one rank)
    lengths: torch.Tensor         # [B] real tokens per row
    seq_len: int                  # S, the width of the right-padded grid
    b: torch.Tensor               # [T_local] grid row of each local row, -1 on padding/filler
    t: torch.Tensor               # [T_local] position in that row, -1 on padding/filler

    @classmethod
    def build(cls, lengths: torch.Tensor, seq_len: int, group=None, *, padded_total: int | None = None
              ) -> PackedShard:
        """Pack rows of ``lengths`` (each in 1..seq_len) and shard them; ``padded_total`` adds a filler
        document so the padded stream has exactly that many tokens (a multiple of 2C, >= the natural)."""
        lengths = torch.as_tensor(lengths).long().cpu()
        if lengths.dim() != 1 or lengths.numel() == 0:
            raise ValueError(f"lengths must be a non-empty 1-D tensor, got shape {tuple(lengths.shape)}")
        if int(lengths.min()) < 1 or int(lengths.max()) > seq_len:
            raise ValueError(f"row lengths must lie in [1, seq_len={seq_len}], got min {int(lengths.min())} "
                             f"max {int(lengths.max())}")
        _, C = group_rank_size(group)
        natural = padded_length(lengths, C)
        docs = lengths
        if padded_total is not None and padded_total != natural:
            mult = 1 if C == 1 else 2 * C
            extra = padded_total - natural
            if extra < 0 or extra % mult:
                raise ValueError(f"padded_total={padded_total} is invalid: expected >= {natural} (this "
                                 f"microbatch padded for cp={C}) and {natural} plus a multiple of {mult}")
            docs = torch.cat([lengths, torch.tensor([extra])])
        cu = torch.cat([torch.zeros(1, dtype=torch.long), docs.cumsum(0)])
        lay = make_layout(cu, group)
        g = lay.global_rows()
        B = lengths.numel()
        real = (g >= 0) & (lay.doc_id < B)
        b = torch.where(real, lay.doc_id, torch.full_like(g, -1))
        t = torch.where(real, g - cu[lay.doc_id], torch.full_like(g, -1))
        return cls(lay, group, lengths, int(seq_len), b, t)

    # -- shape facts ---------------------------------------------------------------------------------
    @property
    def num_local(self) -> int:
        return self.layout.num_local

    @property
    def cp_size(self) -> int:
        return self.layout.cp_size

    @property
    def rank(self) -> int:
        return self.layout.rank

    @property
    def real(self) -> torch.Tensor:
        """[T_local] bool: the row is a real token of some grid row."""
        return self.b >= 0

    @property
    def position_ids(self) -> torch.Tensor:
        """RoPE positions of the local rows (``t`` on real rows)."""
        return self.layout.position_ids

    def valid(self, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Which grid positions ``(b, t)`` hold real tokens."""
        b, t = b.long().cpu(), t.long().cpu()
        ok = (b >= 0) & (b < self.lengths.numel()) & (t >= 0)
        return ok & (t < self.lengths[b.clamp(0, self.lengths.numel() - 1)])

    def flat_index(self, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Index of ``(b, t)`` in the packed real stream (-1 where not a real token)."""
        cu = torch.cat([torch.zeros(1, dtype=torch.long), self.lengths.cumsum(0)])
        b, t = b.long().cpu(), t.long().cpu()
        ok = self.valid(b, t)
        return torch.where(ok, cu[b.clamp(0, self.lengths.numel() - 1)] + t, torch.full_like(t, -1))

    def owner(self, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """CP rank holding ``(b, t)`` (-1 where not a real token)."""
        g = self.flat_index(b, t)
        out = torch.full_like(g, -1)
        ok = g >= 0
        if bool(ok.any()):
            out[ok] = self.layout.locate(g[ok])[2]
        return out

    # -- global grids read at local rows ---------------------------------------------------------------
    def at(self, grid: torch.Tensor, b: torch.Tensor, t: torch.Tensor, fill=0) -> torch.Tensor:
        """``grid[b, t]`` of a global ``[B, S, ...]`` tensor (``fill`` where ``(b, t)`` is off the grid:
        b = -1, t < 0 or t >= S; positions past a row's length are read as the grid holds them)."""
        B, S = grid.shape[:2]
        b, t = b.to(grid.device).long(), t.to(grid.device).long()
        ok = (b >= 0) & (b < B) & (t >= 0) & (t < S)
        out = grid[b.clamp(0, B - 1), t.clamp(0, S - 1)]
        keep = ok.view(*ok.shape, *([1] * (out.dim() - ok.dim())))
        return torch.where(keep, out, torch.as_tensor(fill, dtype=grid.dtype, device=grid.device))

    def local(self, grid: torch.Tensor, shift: int = 0, fill=0) -> torch.Tensor:
        """``grid[b, t + shift]`` at every local row (``fill`` on padding/filler rows and off the grid)."""
        t = torch.where(self.real, self.t + shift, self.t)
        return self.at(grid, self.b, t, fill)

    # -- sharded tensors read at any grid position -------------------------------------------------------
    def fetch(self, x_local: torch.Tensor, b: torch.Tensor, t: torch.Tensor, fill=0) -> torch.Tensor:
        """Rows of the sharded ``x_local [T_local, ...]`` at grid positions ``(b, t)`` (any rank's), detached.

        Positions that hold no real token give ``fill``. Collective over the group: every rank calls
        it the same number of times (with its own requests)."""
        if x_local.shape[0] != self.num_local:
            raise ValueError(f"fetch: x_local has {x_local.shape[0]} rows, this rank holds {self.num_local}")
        x_local = x_local.detach()
        dev = x_local.device
        g = self.flat_index(b.flatten(), t.flatten())
        n = g.numel()
        out = x_local.new_full((n, *x_local.shape[1:]), fill)
        ok = g >= 0
        owner = torch.full_like(g, -1)
        row = torch.zeros_like(g)
        if bool(ok.any()):
            loc = self.layout.locate(g[ok])
            owner[ok], row[ok] = loc[2], loc[3]
        mine = owner == self.rank
        out[mine.to(dev)] = x_local[row[mine].to(dev)]
        C = self.cp_size
        if C == 1:
            return out.view(*b.shape, *x_local.shape[1:])
        remote = torch.nonzero(ok & ~mine).flatten()
        remote = remote[torch.argsort(owner[remote], stable=True)]
        send_n = torch.bincount(owner[remote], minlength=C)           # rows I want from each rank
        recv_n = torch.empty(C, dtype=torch.long, device=dev)
        dist.all_to_all_single(recv_n, send_n.to(dev), group=self.group)
        recv_n = recv_n.cpu()
        asked = torch.empty(int(recv_n.sum()), dtype=torch.long, device=dev)   # my rows others want
        dist.all_to_all_single(asked, row[remote].to(dev), recv_n.tolist(), send_n.tolist(), group=self.group)
        got = x_local.new_empty((remote.numel(), *x_local.shape[1:]))
        dist.all_to_all_single(got, x_local[asked].contiguous(), send_n.tolist(), recv_n.tolist(),
                               group=self.group)
        out[remote.to(dev)] = got
        return out.view(*b.shape, *x_local.shape[1:])

    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of a (detached) tensor over the group."""
        y = x.detach().clone()
        if self.cp_size > 1:
            dist.all_reduce(y, group=self.group)
        return y


def grpo_targets(shard: PackedShard, ids: torch.Tensor, mask: torch.Tensor, logp_rollout: torch.Tensor,
                 advantages: torch.Tensor) -> torch.Tensor:
    """Per local row ``(b, t)``: the GRPO target of predicting token ``t + 1`` of row ``b``.

    Returns ``[T_local, 4]`` float64 columns (next token id, loss mask, rollout log-prob of it,
    advantage of the row); rows whose next token is not real (or padding/filler rows) get mask 0.
    """
    nxt_ok = shard.valid(shard.b, shard.t + 1) & shard.real
    label = torch.where(nxt_ok, shard.local(ids, 1), torch.zeros_like(shard.b))
    zero = torch.zeros(shard.num_local, dtype=torch.float64)
    m = torch.where(nxt_ok, shard.local(mask.double(), 1), zero)
    old = torch.where(nxt_ok, shard.local(logp_rollout.double(), 1), zero)
    adv = torch.where(shard.real, advantages.double()[shard.b.clamp(min=0)], zero)
    return torch.stack([label.double(), m, old, adv], dim=-1)
