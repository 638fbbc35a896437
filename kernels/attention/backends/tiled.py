"""Tiled backward for any backend: bounded memory for long segments, the same joint-LSE gradients.

A block's backward with the *joint* (out, lse) is additive over any partition of its (query, key)
pairs (kernels/attention/backends/base.py), so it can run as tiles of ``tile`` query rows x
``kv_tile`` keys (default: square) in the packed index space. For a "causal" spec the tiles on the
diagonal are causal (documents clipped to the tile) and those below it are "full"; tiles above it
are skipped; a "full" spec is tiled everywhere. ``kv_tile=0`` leaves the keys below the diagonal in
one call per query tile (fewer calls and dq sums; the call's key-side buffers then span the prefix).
Query tiles are the outer loop: a tile row's dq parts are summed in an
acc_dtype buffer of ``tile`` rows and written once; dk/dv are summed over query tiles in
``grad_acc`` ("input": q's dtype, no extra buffer, one extra rounding per tile row in bf16;
"fp32": acc_dtype buffers of the size of k and v). Every kernel call then sees at most ``tile``
rows and ``kv_tile`` keys, so kernel workspaces (cuDNN's / flash's fp32 dQ accumulators) and the
per-call gradient outputs are bounded by the tile instead of the document length.

The forward is the inner backend's, untouched. "prefix" specs (block drafts, small) and blocks that
fit in one tile go to the inner backend as they are.

    b = TiledBackward(backends.get("cudnn"), tile=16384)      # registered as "tiled[cudnn]"
"""
from __future__ import annotations

import torch

from kernels.attention.backends.base import Backend, acc_dtype
from kernels.attention.spec import MaskSpec
from kernels.backend_names import tiled

GRAD_ACC = ("input", "fp32")


def clip(spec: MaskSpec, a: int, b: int, c: int, d: int, kind: str) -> MaskSpec | None:
    """The sub-spec of rows [a, b) x keys [c, d) with ``kind`` inside each clipped segment; None
    when no segment has both rows and keys there. Segments keep their order; empty ones are dropped
    unless they carry rows or keys (so the sub-spec's boundaries still cover [a, b) and [c, d))."""
    lq = spec.cu_q[1:].clamp(a, b) - spec.cu_q[:-1].clamp(a, b)
    lk = spec.cu_k[1:].clamp(c, d) - spec.cu_k[:-1].clamp(c, d)
    if not bool(((lq > 0) & (lk > 0)).any()):
        return None
    keep = (lq > 0) | (lk > 0)
    z = torch.zeros(1, dtype=torch.int64)
    return MaskSpec(kind, torch.cat([z, lq[keep].cumsum(0)]), torch.cat([z, lk[keep].cumsum(0)]))


def tiles(spec: MaskSpec, tile: int, kv_tile: int | None = None):
    """Yield (a, b, [(c, d, sub_spec), ...]) per query tile [a, b), in query order.

    Keys are cut every ``kv_tile`` (default ``tile``; 0: not cut). For a causal spec a query tile
    meets the keys before it ("full" sub-specs) and its own diagonal square [a, b) ("causal")."""
    Tq, Tk = spec.num_q, spec.num_k
    kvt = tile if kv_tile is None else (kv_tile or max(1, Tk))
    for a in range(0, Tq, tile):
        b = min(Tq, a + tile)
        row = []
        if spec.kind == "causal":
            bounds = [(c, min(a, c + kvt), "full") for c in range(0, a, kvt)] + [(a, b, "causal")]
        else:
            bounds = [(c, min(Tk, c + kvt), "full") for c in range(0, Tk, kvt)]
        for c, d, kind in bounds:
            sub = clip(spec, a, b, c, d, kind)
            if sub is not None:
                row.append((c, d, sub))
        yield a, b, row


class TiledBackward(Backend):
    def __init__(self, inner: Backend, tile: int = 16384, grad_acc: str = "input", kv_tile: int | None = None):
        if not isinstance(tile, int) or tile < 1:
            raise ValueError(f"tile must be a positive number of rows, got {tile!r}")
        if kv_tile is not None and (not isinstance(kv_tile, int) or kv_tile < 0):
            raise ValueError(f"kv_tile must be None (= tile), 0 (keys not cut) or a positive number, got {kv_tile!r}")
        if grad_acc not in GRAD_ACC:
            raise ValueError(f"grad_acc must be one of {GRAD_ACC}, got {grad_acc!r}")
        self.inner, self.tile, self.grad_acc, self.kv_tile = inner, tile, grad_acc, kv_tile
        self.name = tiled(inner.name)

    def supports(self, spec, device, dtype) -> bool:
        return self.inner.supports(spec, device, dtype)

    def unavailable_reason(self, spec, device, dtype):
        return self.inner.unavailable_reason(spec, device, dtype)

    def forward(self, q, k, v, spec, scale):
        return self.inner.forward(q, k, v, spec, scale)

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        if spec.kind == "prefix" or (spec.num_q <= self.tile and spec.num_k <= self.tile):
            return self.inner.backward(dout, q, k, v, out, lse, spec, scale)
        acc = acc_dtype(q.dtype)
        kv_dtype = k.dtype if self.grad_acc == "input" else acc
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        dk = torch.zeros(k.shape, dtype=kv_dtype, device=q.device)
        dv = torch.zeros(v.shape, dtype=kv_dtype, device=q.device)
        buf = None                                   # one acc-dtype dq buffer of `tile` rows, reused
        for a, b, row in tiles(spec, self.tile, self.kv_tile):
            if not row:
                dq[a:b] = 0
                continue
            if buf is None:
                buf = torch.empty((self.tile, *q.shape[1:]), dtype=acc, device=q.device)
            dqt = buf[:b - a]
            for i, (c, d, sub) in enumerate(row):
                gq, gk, gv = self.inner.backward(dout[a:b], q[a:b], k[c:d], v[c:d], out[a:b], lse[a:b], sub,
                                                 scale)
                if i == 0:
                    dqt.copy_(gq)
                else:
                    dqt += gq
                dk[c:d] += gk
                dv[c:d] += gv
                del gq, gk, gv
            dq[a:b] = dqt
        return dq, dk, dv
