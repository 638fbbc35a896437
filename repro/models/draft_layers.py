"""Building blocks the three draft families share: RMSNorm, SwiGLU, RoPE, a draft KV cache, cache attention.

Training-time attention of the drafts goes through ``kernels.attention`` (the TTT and block masks
live there). Inference-time attention over a draft's ragged KV cache uses the masks of
``repro.decoding.kv.SlotTable`` (the same rule as the policy's cache) and torch SDPA.

    rope = Rotary(head_dim=64, theta=1e4)
    q = rope(q, positions)                 # q [..., T, H, D], positions [..., T]
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from kernels.attention import Layout, make_layout
from kernels.attention.grouped import grouped_sdpa
from repro.decoding.kv import gather_slots


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)
        return F.rms_norm(x, (x.shape[-1],), w, self.eps)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Rotary(nn.Module):
    """Rotate-half RoPE (Llama/Qwen3 layout); the inverse frequencies are kept in fp32 (as vLLM does)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        self.register_buffer("inv_freq", inv.float(), persistent=False)
        self._memo: tuple | None = None   # (positions, dtype, cos, sin) of the last call

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        # q and k of a layer, and every layer of a forward, share one positions tensor: compute once
        m = self._memo
        if m is not None and m[0] is positions and m[1] == dtype:
            return m[2], m[3]
        cdt = torch.float64 if dtype == torch.float64 else torch.float32
        inv = self.inv_freq if self.inv_freq.dtype == cdt else self.inv_freq.to(cdt)
        ang = positions.to(cdt).unsqueeze(-1) * inv                            # [..., T, D/2]
        emb = torch.cat([ang, ang], dim=-1).unsqueeze(-2)                      # [..., T, 1, D]
        cos, sin = emb.cos(), emb.sin()
        if dtype != cdt:
            cos, sin = cos.to(dtype), sin.to(dtype)
        self._memo = (positions, dtype, cos, sin)
        return cos, sin

    def forget(self) -> None:
        """Drop the memo: a caller that refills one positions tensor in place (a static buffer) or records a
        CUDA graph (whose replays must recompute cos/sin) calls this first."""
        self._memo = None

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x [..., T, H, D]`` rotated at ``positions [..., T]`` (broadcast over heads)."""
        cos, sin = self._cos_sin(positions, x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DraftKV:
    """One draft layer's inference cache: keys/values ``[B, G, S, D]`` plus the shared ``SlotTable``."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k/v [B, q, G, D]``; returns the whole cache ``[B, G, S, D]``."""
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def trim(self, length: int) -> None:
        if self.k is not None:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]

    def select(self, rows: torch.Tensor) -> None:
        if self.k is not None:
            self.k, self.v = self.k[rows], self.v[rows]

    def gather(self, order: torch.Tensor) -> None:
        """Apply a ``SlotTable.compact`` order."""
        if self.k is not None:
            self.k, self.v = gather_slots(self.k, order), gather_slots(self.v, order)


def cache_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, *,
                    sees_a_key: bool = False) -> torch.Tensor:
    """SDPA of ``q [B, q, H, D]`` over ``k/v [B, G, S, D]`` with a bool ``visible [B, q, S]``; out ``[B, q, H, D]``.

    Rows that see no key return 0 (never NaN). A caller whose every query sees a key (its own, just written)
    says so with ``sees_a_key=True`` and skips that guard's five ops.
    """
    if sees_a_key:
        return grouped_sdpa(q.transpose(1, 2), k, v, visible.unsqueeze(1)).transpose(1, 2)
    any_key = visible.any(-1, keepdim=True)                                  # [B, q, 1]
    vis = visible | ~any_key                                                  # keep SDPA NaN-free
    out = grouped_sdpa(q.transpose(1, 2), k, v, vis.unsqueeze(1))
    return out.transpose(1, 2) * any_key.unsqueeze(-1).to(out.dtype)


def batch_to_packed(x: torch.Tensor) -> torch.Tensor:
    """``[B, S, ...]`` -> ``[B*S, ...]``: each row becomes one packed document of length S."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def row_cu_seqlens(B: int, S: int, device) -> torch.Tensor:
    return torch.arange(B + 1, dtype=torch.long, device=device) * S


@functools.lru_cache(maxsize=64)
def row_layout(B: int, S: int) -> Layout:
    """The single-rank packed layout of a right-padded ``[B, S]`` batch (each row one document of S).

    Built once per shape and handed to every attention call of a forward (all TTT passes, all block
    layers) instead of ``cu_seqlens``, which would rebuild it per call: a per-document loop that costs
    more host time than the draft's kernels at RL batch shapes. Layouts are read-only."""
    return make_layout(row_cu_seqlens(B, S, "cpu"))

