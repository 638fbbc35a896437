"""The baseline as SpecForge builds it: USP (Ulysses all-to-all over heads + a sequential ring).

Faithful to SpecForge's ``LlamaUSPFlashAttention`` / ``_USPRingFlashCachedMergeFunc`` semantics
(reference: shared/reference/cp_attention.md section 2), re-implemented here:

* a padded batch [B, S_pad] (no packing; S_pad = max length rounded up to a multiple of C = U*R),
  each rank g = ring_rank*U + ulysses_rank holding the contiguous slice g of every row (plus a
  ``ttt_length`` read-ahead overlap that only feeds the targets: counted, not attended);
* yunchang grouping with ``use_ulysses_low``: Ulysses groups are U consecutive ranks, ring groups
  are ranks strided by U;
* per TTT pass: all-to-all q, k, v (scatter heads, gather sequence), append k, v to the pass cache,
  the *basic* (sequential, unbalanced) causal ring over pass-0 K/V, the diagonal merge of passes
  1..k, all-to-all back. Backward: ring backward with the merged (out, lse) plus closed-form diagonals.
* the head-divisibility constraint (H % U == 0 and G % U == 0) as a clear error.

    groups = make_usp_groups(U, R)                         # collective: every rank calls it
    batch = UspBatch(lengths, cp=U*R, ttt_length=3, ulysses=U)   # padding and pad factor
    cache = []                                             # post-all-to-all K/V of earlier passes
    out = usp_eagle3_ttt_attention(q, k, v, cache, groups) # q [B, S_loc, H, D] -> out like q
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from kernels.attention.branch import TTTBranch
from kernels.attention.layout import make_layout
from kernels.attention.plan import causal_plan
from kernels.attention.ring import RingStats
from kernels.attention.trunk_branch import trunk_branch_attention


def check_usp_heads(H: int, G: int, U: int) -> None:
    if U < 1 or H % U or G % U:
        raise ValueError(f"USP needs the Ulysses degree to divide both head counts: U={U}, query heads H={H}, "
                         f"key/value heads G={G} (H % U = {H % U if U else 'n/a'}, G % U = {G % U if U else 'n/a'})")


def usp_splits(C: int, H: int, G: int) -> list[tuple[int, int]]:
    """Every (U, R) with U * R = C that satisfies the head constraint (the sweep of Figure 5)."""
    return [(U, C // U) for U in range(1, C + 1) if C % U == 0 and H % U == 0 and G % U == 0]


@dataclass(frozen=True)
class UspGroups:
    U: int
    R: int
    ulysses: object          # process group of U consecutive ranks (None when U == 1)
    ring: object             # process group of R ranks strided by U (None when R == 1)
    ulysses_rank: int
    ring_rank: int

    @property
    def rank(self) -> int:
        return self.ring_rank * self.U + self.ulysses_rank


def make_usp_groups(U: int, R: int) -> UspGroups:
    """yunchang's grouping over the default group (world = U * R). Collective: all ranks call it."""
    world = dist.get_world_size()
    if U < 1 or R < 1 or U * R != world:
        raise ValueError(f"USP degrees U={U}, R={R} must be >= 1 with U * R = world size {world}")
    rank = dist.get_rank()
    my_u = my_r = None
    for i in range(R):                      # Ulysses groups: U consecutive ranks
        ranks = list(range(i * U, (i + 1) * U))
        g = dist.new_group(ranks) if U > 1 else None
        if rank in ranks:
            my_u = g
    for j in range(U):                      # ring groups: ranks strided by U
        ranks = list(range(j, world, U))
        g = dist.new_group(ranks) if R > 1 else None
        if rank in ranks:
            my_r = g
    return UspGroups(U, R, my_u, my_r, rank % U, rank // U)


class UspBatch:
    """SpecForge's padded layout for a list of sequence lengths on C = U*R ranks.

    ``ring="sequential"`` (SpecForge): rank g holds the contiguous slice g of every row.
    ``ring="zigzag"`` (yunchang's zigzag ring inside USP, "USP-zigzag"; ours, not SpecForge's): every
    row is cut into 2R chunks, ring rank r gets chunks r and 2R-1-r, and its Ulysses group splits
    those contiguously; rows are padded to a multiple of 2C.
    """

    def __init__(self, lengths, cp: int, ttt_length: int = 0, force_pad_factor: float | None = None,
                 ulysses: int = 1, ring: str = "sequential"):
        self.lengths = [int(x) for x in lengths]
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError(f"lengths must be positive, got {self.lengths}")
        if ring not in ("sequential", "zigzag"):
            raise ValueError(f"ring must be 'sequential' or 'zigzag', got {ring!r}")
        if ulysses < 1 or cp % ulysses:
            raise ValueError(f"ulysses={ulysses} must divide cp={cp}")
        self.cp, self.ttt_length, self.U, self.ring = cp, ttt_length, ulysses, ring
        s_max = max(self.lengths)
        if force_pad_factor is not None:       # pad the batch to a target factor (e.g. the paper's 2.25)
            s_max = max(s_max, int(force_pad_factor * sum(self.lengths) / len(self.lengths)))
        mult = 2 * cp if ring == "zigzag" else cp
        self.s_pad = -(-s_max // mult) * mult
        self.chunk = self.s_pad // cp

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def padded_tokens(self) -> int:
        return len(self.lengths) * self.s_pad

    @property
    def pad_factor(self) -> float:
        """Tokens the attention processes over real tokens."""
        return self.padded_tokens / self.real_tokens

    @property
    def pad_factor_with_overlap(self) -> float:
        """Including each rank's ttt_length read-ahead rows (ids/targets only)."""
        return len(self.lengths) * self.cp * (self.chunk + self.ttt_length) / self.real_tokens

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """Packed real tokens [sum L, ...] -> padded batch [B, S_pad, ...]."""
        out = x.new_zeros((len(self.lengths), self.s_pad, *x.shape[1:]))
        o = 0
        for b, L in enumerate(self.lengths):
            out[b, :L] = x[o:o + L]
            o += L
        return out

    def unpad(self, xb: torch.Tensor) -> torch.Tensor:
        return torch.cat([xb[b, :L] for b, L in enumerate(self.lengths)])

    def position_ids(self, rank: int) -> torch.Tensor:
        """Positions (columns of the padded batch) that ``rank`` holds, in its local order."""
        if self.ring == "sequential":
            return rank * self.chunk + torch.arange(self.chunk)
        R = self.cp // self.U
        r, u = rank // self.U, rank % self.U
        half = self.s_pad // (2 * R)
        cols = torch.cat([torch.arange(r * half, (r + 1) * half),
                          torch.arange((2 * R - 1 - r) * half, (2 * R - r) * half)])
        return cols[u * self.chunk:(u + 1) * self.chunk]

    def local(self, xb: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank's rows [B, chunk, ...] of a padded batch (attended rows; no overlap)."""
        if self.ring == "sequential":
            return xb[:, rank * self.chunk:(rank + 1) * self.chunk]
        return xb.index_select(1, self.position_ids(rank).to(xb.device))


class _SeqAllToAll(torch.autograd.Function):
    """[B, S, heads, D]: scatter heads / gather sequence (forward); the inverse in backward."""

    @staticmethod
    def _a2a(x: torch.Tensor, group, U: int, scatter_heads: bool, stats) -> torch.Tensor:
        if scatter_heads:                                  # [B,S,H,D] -> [B,U*S,H/U,D]
            B, S, H, D = x.shape
            send = x.reshape(B, S, U, H // U, D).permute(2, 0, 1, 3, 4).contiguous()
        else:                                              # [B,U*S,h,D] -> [B,S,U*h,D]
            B, US, h, D = x.shape
            send = x.reshape(B, U, US // U, h, D).permute(1, 0, 2, 3, 4).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        if stats is not None:
            stats.bytes["a2a"] = stats.bytes.get("a2a", 0) + send.numel() * send.element_size() * (U - 1) // U
        if scatter_heads:
            U_, B, S, hh, D = recv.shape
            return recv.permute(1, 0, 2, 3, 4).reshape(B, U_ * S, hh, D)
        U_, B, S, h, D = recv.shape
        return recv.permute(1, 2, 0, 3, 4).reshape(B, S, U_ * h, D)

    @staticmethod
    def forward(ctx, x, group, U, scatter_heads, stats):
        ctx.cfg = (group, U, scatter_heads, stats)
        return _SeqAllToAll._a2a(x, group, U, scatter_heads, stats)

    @staticmethod
    def backward(ctx, g):
        group, U, scatter_heads, stats = ctx.cfg
        return _SeqAllToAll._a2a(g.contiguous(), group, U, not scatter_heads, stats), None, None, None, None


def seq_all_to_all(x: torch.Tensor, group, U: int, scatter_heads: bool = True, stats=None) -> torch.Tensor:
    if U == 1:
        return x
    return _SeqAllToAll.apply(x, group, U, scatter_heads, stats)


def usp_eagle3_ttt_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: list, groups: UspGroups,
                             *, scale: float | None = None, backend="auto", ring: str = "sequential",
                             stats: RingStats | None = None) -> torch.Tensor:
    """One TTT pass under USP; pass index = len(cache) before the call (pass 0 fills the trunk).

    q [B, S_loc, H, D], k/v [B, S_loc, G, D]: this rank's rows of the padded batch (UspBatch.local
    with the same ``ring``). ``cache`` holds the post-all-to-all (k, v) of earlier passes and is
    appended to. ``ring``: "sequential" (SpecForge's basic ring) or "zigzag" (USP-zigzag, ours).
    """
    if ring not in ("sequential", "zigzag"):
        raise ValueError(f"ring must be 'sequential' or 'zigzag', got {ring!r}")
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2]:
        raise ValueError(f"USP expects q [B,S,H,D] and k/v [B,S,G,D], got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.is_floating_point():
        raise TypeError(f"q, k, v must be floating-point tensors (fp16/bf16/fp32/fp64), got {q.dtype}")
    B, S, H, D = q.shape
    G = k.shape[2]
    check_usp_heads(H, G, groups.U)
    U, R = groups.U, groups.R
    scale = D ** -0.5 if scale is None else float(scale)
    qa = seq_all_to_all(q, groups.ulysses, U, True, stats)
    ka = seq_all_to_all(k, groups.ulysses, U, True, stats)
    va = seq_all_to_all(v, groups.ulysses, U, True, stats)
    cache.append((ka, va))
    M = U * S
    cu = torch.arange(B + 1, dtype=torch.int64) * (R * M)
    lay = make_layout(cu, None, scheme=ring, cp_size=R, rank=groups.ring_rank)
    plan = causal_plan(lay, q.device)
    P = len(cache) - 1
    flat = lambda x: x.reshape(B * M, x.shape[2], D)
    branch = TTTBranch(P) if P > 0 else None
    bt = (*[flat(c[0]) for c in cache[1:]], *[flat(c[1]) for c in cache[1:]])
    out, _ = trunk_branch_attention(flat(qa), flat(cache[0][0]), flat(cache[0][1]), plan, groups.ring, branch, bt,
                                    scale=scale, backend=backend, stats=stats)
    return seq_all_to_all(out.view(B, M, H // U, D), groups.ulysses, U, False, stats)
