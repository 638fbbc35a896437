"""Where each packed token lives under context parallelism: zigzag (and sequential) sharding.

Packed documents (global boundaries ``cu_seqlens``, int64) are split over the C ranks of a group.

    zigzag      each document is padded to a multiple of 2C and cut into 2C equal chunks; rank r holds
                chunks r and 2C-1-r of every document (load-balanced causal work).
    sequential  each document is padded to a multiple of C and cut into C chunks; rank r holds chunk r
                (the "basic" ring of yunchang/SpecForge; imbalanced, used as a baseline and in tests).

Padding goes at the end of each document, so real tokens never see pads. With C = 1 nothing is
padded and the local rows are the global packed rows.

    layout = make_layout(cu_seqlens, group)          # group None -> one rank
    q_local = layout.shard(q_global)                 # [T_local, ...], pads are zero
    pos = layout.position_ids                        # RoPE positions of the local rows (per document)
    q_global = layout.unshard([q_rank0, q_rank1, ...])
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from kernels.attention.spec import check_cu

SCHEMES = ("zigzag", "sequential")


def group_rank_size(group) -> tuple[int, int]:
    """(rank, size) of this process in ``group``; (0, 1) for None."""
    if group is None:
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def pad_varlen(cu_seqlens: torch.Tensor, multiple: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad every document to a multiple of ``multiple``; returns (cu_padded, real_token_mask[T_pad])."""
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    cu = check_cu(cu_seqlens, None)
    lens = cu.diff()
    plen = (lens + multiple - 1) // multiple * multiple
    cu_pad = torch.cat([torch.zeros(1, dtype=torch.int64), plen.cumsum(0)])
    doc = torch.repeat_interleave(torch.arange(lens.numel()), plen)
    pos = torch.arange(int(cu_pad[-1])) - cu_pad[doc]
    return cu_pad, pos < lens[doc]


@dataclass(frozen=True, eq=False)
class Layout:
    """The rows one rank holds; build with ``make_layout``. All index tensors are int64 on CPU."""

    scheme: str
    cp_size: int
    rank: int
    cu_seqlens: torch.Tensor     # global, real tokens
    cu_padded: torch.Tensor      # global, padded documents
    chunk: torch.Tensor          # [S] chunk length per document
    index: torch.Tensor          # [T_local] -> row of the padded global stream
    cu_local: torch.Tensor       # [S+1] local document boundaries (identical on every rank)
    cu_half: torch.Tensor        # [S+1] zigzag: boundaries of the front (early) chunk rows
    front_rows: torch.Tensor     # zigzag: local rows of chunk r
    back_rows: torch.Tensor      # zigzag: local rows of chunk 2C-1-r
    doc_id: torch.Tensor         # [T_local]
    position_ids: torch.Tensor   # [T_local] position inside the document (pads continue counting)
    real: torch.Tensor           # [T_local] bool, False on padding rows

    @property
    def num_local(self) -> int:
        return int(self.index.numel())

    @property
    def num_docs(self) -> int:
        return int(self.cu_seqlens.numel() - 1)

    @property
    def num_real(self) -> int:
        return int(self.cu_seqlens[-1])

    def _real_of_padded(self) -> torch.Tensor:
        """For each padded global row, its row in the real stream (or -1 for padding)."""
        cu, cp = self.cu_seqlens, self.cu_padded
        doc = torch.repeat_interleave(torch.arange(self.num_docs), cp.diff())
        pos = torch.arange(int(cp[-1])) - cp[doc]
        return torch.where(pos < cu.diff()[doc], cu[doc] + pos, torch.full_like(pos, -1))

    def global_rows(self) -> torch.Tensor:
        """[T_local] row of each local token in the global (real, unpadded) stream, -1 for pads."""
        return self._real_of_padded()[self.index]

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global packed tensor ``x[T_real, ...]`` (pads are zero)."""
        if x.shape[0] != self.num_real:
            raise ValueError(f"shard expects {self.num_real} rows (cu_seqlens[-1]), got {x.shape[0]}")
        g = self.global_rows().to(x.device)
        out = x.new_zeros((self.num_local, *x.shape[1:]))
        keep = g >= 0
        out[keep] = x[g[keep]]
        return out

    def unshard(self, parts: list[torch.Tensor], layouts: list[Layout] | None = None) -> torch.Tensor:
        """Reassemble the global real stream from every rank's local tensor (rank order)."""
        layouts = layouts or [make_layout(self.cu_seqlens, None, scheme=self.scheme, cp_size=self.cp_size,
                                          rank=r) for r in range(self.cp_size)]
        if len(parts) != len(layouts):
            raise ValueError(f"unshard needs {len(layouts)} parts, got {len(parts)}")
        out = parts[0].new_zeros((self.num_real, *parts[0].shape[1:]))
        for p, lay in zip(parts, layouts):
            g = lay.global_rows().to(p.device)
            keep = g >= 0
            out[g[keep]] = p[keep]
        return out

    def locate(self, token: torch.Tensor):
        """For global real token indices: (doc, position, owner rank, local row on the owner, is_back)."""
        token = token.to("cpu", torch.int64)
        if token.numel() and (int(token.min()) < 0 or int(token.max()) >= self.num_real):
            raise ValueError(f"token indices must lie in [0, {self.num_real}), got min {int(token.min())} "
                             f"max {int(token.max())}")
        doc = torch.searchsorted(self.cu_seqlens, token, right=True) - 1
        pos = token - self.cu_seqlens[doc]
        c = self.chunk[doc]
        C = self.cp_size
        if C == 1:
            return doc, pos, torch.zeros_like(pos), self.cu_local[doc] + pos, torch.zeros_like(pos, dtype=torch.bool)
        ch = pos // c
        if self.scheme == "sequential":
            return doc, pos, ch, self.cu_local[doc] + pos - ch * c, torch.zeros_like(pos, dtype=torch.bool)
        back = ch >= C
        owner = torch.where(back, 2 * C - 1 - ch, ch)
        local = self.cu_local[doc] + torch.where(back, c + pos - ch * c, pos - ch * c)
        return doc, pos, owner, local, back


def make_layout(cu_seqlens: torch.Tensor, group=None, *, scheme: str = "zigzag", cp_size: int | None = None,
                rank: int | None = None) -> Layout:
    """Layout of this rank (or of ``rank`` of a ``cp_size`` group, for tests and cost models)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    cu = check_cu(cu_seqlens, None)
    if group is not None:
        r, C = group_rank_size(group)
        if cp_size is not None and cp_size != C:
            raise ValueError(f"cp_size={cp_size} disagrees with the group size {C}")
    else:
        C, r = cp_size or 1, rank or 0
    if not (0 <= r < C):
        raise ValueError(f"rank {r} outside a group of {C}")
    mult = 1 if C == 1 else (2 * C if scheme == "zigzag" else C)
    cu_pad, _ = pad_varlen(cu, mult)
    plen = cu_pad.diff()
    S = plen.numel()
    nchunks = 1 if C == 1 else (2 * C if scheme == "zigzag" else C)
    chunk = plen // nchunks
    idx, front, back, docs, pos = [], [], [], [], []
    local_len = plen // C
    cu_local = torch.cat([torch.zeros(1, dtype=torch.int64), local_len.cumsum(0)])
    for d in range(S):
        base, c = int(cu_pad[d]), int(chunk[d])
        if C == 1:
            parts = [torch.arange(base, base + int(plen[d]))]
        elif scheme == "zigzag":
            parts = [torch.arange(base + r * c, base + (r + 1) * c),
                     torch.arange(base + (2 * C - 1 - r) * c, base + (2 * C - r) * c)]
        else:
            parts = [torch.arange(base + r * c, base + (r + 1) * c)]
        rows = torch.cat(parts)
        idx.append(rows)
        docs.append(torch.full((rows.numel(),), d, dtype=torch.int64))
        pos.append(rows - base)
        lo = int(cu_local[d])
        if C > 1 and scheme == "zigzag":
            front.append(torch.arange(lo, lo + c))
            back.append(torch.arange(lo + c, lo + 2 * c))
        else:
            front.append(torch.arange(lo, lo + rows.numel()))
    cat = lambda xs: torch.cat(xs) if xs else torch.zeros(0, dtype=torch.int64)
    index, doc_id, position = cat(idx), cat(docs), cat(pos)
    half = chunk if (C > 1 and scheme == "zigzag") else local_len
    cu_half = torch.cat([torch.zeros(1, dtype=torch.int64), half.cumsum(0)])
    return Layout(scheme, C, r, cu, cu_pad, chunk, index, cu_local, cu_half, cat(front), cat(back),
                  doc_id, position, position < cu.diff()[doc_id])
