"""Mask descriptions shared by every attention backend: the "flash contract" (MaskSpec) and its checks.

A block computation attends queries ``q[Tq, H, D]`` to keys/values ``k, v[Tk, G, D]`` (G divides H:
grouped-query attention). Rows and keys are split into the same number of *segments* (packed
documents): ``cu_q``/``cu_k`` are int64 CPU boundaries, and a query of segment s only ever sees keys of
segment s. Inside a segment the visible keys are a contiguous range chosen by ``kind``:

    "full"    every key of the segment
    "causal"  query i of the segment sees keys 0..i of the segment (top-left aligned; Lq == Lk)
    "prefix"  query row t sees keys [cu_k[s], key_end[t]) (absolute key indices; DFlash trunk)

A row that sees no key gets out = 0 and lse = -inf (the contract of every backend).

    spec = MaskSpec.causal(cu_seqlens)
    spec.pairs()     # number of visible (query, key) pairs: the FLOP counter's unit
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

KINDS = ("full", "causal", "prefix")


def check_cu(cu: torch.Tensor, total: int | None, name: str = "cu_seqlens") -> torch.Tensor:
    """Validate packed boundaries: 1-D integer, starts at 0, non-decreasing, ends at ``total``."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int64 boundaries, got {type(cu).__name__}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name} must be 1-D with at least 2 entries [0, ..., T], got shape {tuple(cu.shape)}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32/int64, got {cu.dtype}")
    cu = cu.detach().to("cpu", torch.int64)
    if int(cu[0]) != 0:
        raise ValueError(f"{name}[0] must be 0, got {int(cu[0])}")
    if bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"{name} must be non-decreasing, got {cu.tolist()[:16]}")
    if total is not None and int(cu[-1]) != total:
        raise ValueError(f"{name}[-1] = {int(cu[-1])} disagrees with the number of rows T = {total}")
    return cu


@dataclass(frozen=True, eq=False)
class MaskSpec:
    """Which keys each query row sees; see the module docstring."""

    kind: str
    cu_q: torch.Tensor            # int64 CPU [S+1]
    cu_k: torch.Tensor            # int64 CPU [S+1]
    key_end: torch.Tensor | None = None   # prefix only: int64 CPU [Tq]
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"MaskSpec.kind must be one of {KINDS}, got {self.kind!r}")
        if self.cu_q.numel() != self.cu_k.numel():
            raise ValueError(f"cu_q and cu_k need the same number of segments, got {self.cu_q.numel() - 1} "
                             f"and {self.cu_k.numel() - 1}")
        if self.kind == "causal":
            lq, lk = self.cu_q.diff(), self.cu_k.diff()
            if not torch.equal(lq, lk):
                raise ValueError("causal MaskSpec needs equal query and key segment lengths")
        if (self.kind == "prefix") != (self.key_end is not None):
            raise ValueError("key_end is required for kind='prefix' and only for it")
        if self.key_end is not None and self.key_end.numel() != self.num_q:
            raise ValueError(f"key_end has {self.key_end.numel()} entries, expected Tq = {self.num_q}")

    @staticmethod
    def causal(cu: torch.Tensor) -> MaskSpec:
        cu = check_cu(cu, None)
        return MaskSpec("causal", cu, cu)

    @staticmethod
    def full(cu_q: torch.Tensor, cu_k: torch.Tensor) -> MaskSpec:
        return MaskSpec("full", check_cu(cu_q, None, "cu_q"), check_cu(cu_k, None, "cu_k"))

    @staticmethod
    def prefix(cu_q: torch.Tensor, cu_k: torch.Tensor, key_end: torch.Tensor) -> MaskSpec:
        return MaskSpec("prefix", check_cu(cu_q, None, "cu_q"), check_cu(cu_k, None, "cu_k"),
                        key_end.to("cpu", torch.int64))

    @property
    def num_q(self) -> int:
        return int(self.cu_q[-1])

    @property
    def num_k(self) -> int:
        return int(self.cu_k[-1])

    def segments(self):
        """Yield (s, q0, q1, k0, k1) for every segment with at least one query and one key."""
        cq, ck = self.cu_q.tolist(), self.cu_k.tolist()
        for s in range(len(cq) - 1):
            if cq[s + 1] > cq[s] and ck[s + 1] > ck[s]:
                yield s, cq[s], cq[s + 1], ck[s], ck[s + 1]

    def key_end_cpu(self) -> list[int]:
        if "key_end" not in self._cache:
            self._cache["key_end"] = self.key_end.tolist()
        return self._cache["key_end"]

    def pairs(self) -> int:
        """Visible (query, key) pairs: causal L(L+1)/2, full Lq*Lk, prefix sum of range lengths."""
        if "pairs" in self._cache:
            return self._cache["pairs"]
        lq, lk = self.cu_q.diff(), self.cu_k.diff()
        if self.kind == "full":
            n = int((lq * lk).sum())
        elif self.kind == "causal":
            n = int((lq * (lq + 1) // 2).sum())
        else:
            seg = torch.repeat_interleave(torch.arange(lq.numel()), lq)
            start = self.cu_k[seg]
            end = self.key_end
            n = int((end - start).clamp_min(0).sum())
        self._cache["pairs"] = n
        return n

    def dense(self, device=None) -> torch.Tensor:
        """The explicit boolean mask [Tq, Tk] (tests and the fp64 reference only)."""
        m = torch.zeros(self.num_q, self.num_k, dtype=torch.bool)
        ke = self.key_end_cpu() if self.kind == "prefix" else None
        for _, q0, q1, k0, k1 in self.segments():
            if self.kind == "full":
                m[q0:q1, k0:k1] = True
            elif self.kind == "causal":
                m[q0:q1, k0:k1] = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool).tril()
            else:
                for t in range(q0, q1):
                    m[t, k0:max(k0, min(ke[t], k1))] = True
        return m.to(device) if device is not None else m
