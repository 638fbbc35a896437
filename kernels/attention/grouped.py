"""Grouped-query attention for decode and verify steps without copying keys/values per query head.

SDPA with a mask and fewer key/value heads than query heads has two routes on a GPU: repeat the keys and values to
every query head (transformers' ``repeat_kv``: a copy of the whole cache view per layer and step, which at batch 64
over a few hundred slots costs more than the layer's matmuls), or ``enable_gqa``, which no masked fused kernel
takes (SDPA falls back to its math kernel). Here the ``r = H / G`` query heads of each group are folded into the
query length instead, ``[B, H, q, D] -> [B, G, r*q, D]``, and the mask is repeated along that length (``r*q*S``
entries per row, not ``r*S*D``), so one masked fused kernel reads every key and value once. Exact: the same
softmax over the same keys per query. On a GPU with Triton, a bf16/fp16 step of at most ``MAX_FOLDED_ROWS`` (64)
folded query rows runs ``kernels.attention.decode_triton`` instead (one program per row and key/value head, the
output written in the layout the model reads next); ``impl="sdpa"`` keeps SDPA. ``grouped_sdpa_write`` first
writes the step's own keys and values into the cache view, in the same kernel where it runs.

    out = grouped_sdpa(q, k, v, mask)      # q [B, H, q, D], k/v [B, G, S, D], mask [B, 1, q, S]: out [B, H, q, D]
    out = grouped_sdpa_write(q, k_new, v_new, k, v, cols, mask)   # k/v[:, :, cols] = k_new/v_new, then the above
                                                                  # (cols [q], or [B, q]: each row its own)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.attention import triton_ops

KERNEL_DTYPES = (torch.bfloat16, torch.float16)
MAX_FOLDED_ROWS = 64     # r * q query rows: one program's tile in decode_triton
# loaded up front where a GPU with bf16 tensor cores (sm80+) is: a compiled step traces the call, and an import
# inside the trace would break it
_KERNEL = (triton_ops.load("decode_triton")
           if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8 else None)


def decode_kernel_fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether a step's shapes suit ``decode_triton`` (few folded query rows, an additive or bool mask, unit-strided
    rows, a power-of-two head dim); whether Triton loads is asked separately."""
    B, H, Q, D = q.shape
    G = k.shape[1]
    return (q.is_cuda and q.dtype in KERNEL_DTYPES and k.dtype == q.dtype and v.dtype == q.dtype
            and (mask.is_floating_point() or mask.dtype == torch.bool) and (H // G) * Q <= MAX_FOLDED_ROWS
            and 16 <= D <= 256 and D & (D - 1) == 0
            and v.shape[-1] == D and k.shape[0] == B and v.shape[0] == B
            and all(t.stride(-1) == 1 for t in (q, k, v, mask)))


def _check(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, impl: str) -> None:
    if impl not in ("auto", "sdpa"):
        raise ValueError(f"grouped_sdpa impl must be 'auto' or 'sdpa', got {impl!r}")
    H, Q = q.shape[1], q.shape[2]
    G, S = k.shape[1], k.shape[2]
    if H % G:
        raise ValueError(f"query heads {H} must be a multiple of key/value heads {G}")
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != Q or mask.shape[3] != S:
        raise ValueError(f"mask must be [B, 1, {Q}, {S}] (one mask for every head), got {tuple(mask.shape)}")


def grouped_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                 scale: float | None = None, impl: str = "auto") -> torch.Tensor:
    """Masked SDPA of ``q [B, H, Q, D]`` over ``k/v [B, G, S, D]`` (query head ``h`` reads key/value head
    ``h // (H / G)``, transformers' layout) with a bool or additive ``mask [B, 1, Q, S]``; out ``[B, H, Q, Dv]``
    (from the Triton kernel a transposed view of ``[B, Q, H, Dv]``). ``impl``: "auto" or "sdpa"."""
    _check(q, k, mask, impl)
    B, H, Q, D = q.shape
    G, S = k.shape[1], k.shape[2]
    r = H // G
    if impl == "auto" and _KERNEL is not None and decode_kernel_fits(q, k, v, mask):
        sc = scale if scale is not None else D ** -0.5
        out = torch.ops.repro.grouped_decode_attention(q, k, v, mask.expand(B, 1, Q, S), sc)
        return out.transpose(1, 2)
    if r == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    qf = q.reshape(B, G, r * Q, D)
    mf = mask.expand(mask.shape[0], r, Q, S).reshape(mask.shape[0], 1, r * Q, S)
    out = F.scaled_dot_product_attention(qf, k, v, attn_mask=mf, scale=scale)
    return out.reshape(B, H, Q, v.shape[-1])


def grouped_sdpa_write(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       cols: torch.Tensor, mask: torch.Tensor, scale: float | None = None,
                       impl: str = "auto", frontier: bool = False) -> torch.Tensor:
    """``k[:, :, cols] = k_new`` and ``v[:, :, cols] = v_new`` (the step's keys/values ``[B, G, q, D]`` into the
    cache view ``k/v [B, G, S, D]``; ``cols`` ``[q]`` distinct columns, or ``[B, q]``: row b's into ``cols[b]``),
    then ``grouped_sdpa(q, k, v, mask)``. Where the Triton kernel takes the step, it does both in one launch;
    elsewhere the write is two index copies (scatters, per row). ``frontier``: the caller's mask hides every column
    past each row's last new one, so the kernel reads a row's keys only up to there (the same result: it is a
    promise about the mask that saves reading the rest of the view)."""
    _check(q, k, mask, impl)
    if (cols.dim() not in (1, 2) or (cols.dim() == 2 and cols.shape[0] != k_new.shape[0])
            or k_new.shape[2] != cols.shape[-1] or v_new.shape[2] != cols.shape[-1]):
        raise ValueError(f"cols must list one column per new key, [q] or [B, q]: cols {tuple(cols.shape)}, k_new "
                         f"{tuple(k_new.shape)}, v_new {tuple(v_new.shape)}")
    if (impl == "auto" and _KERNEL is not None and decode_kernel_fits(q, k, v, mask) and k_new.dtype == k.dtype
            and v_new.dtype == v.dtype and k_new.stride(-1) == 1 and v_new.stride(-1) == 1):
        B, H, Q, D = q.shape
        sc = scale if scale is not None else D ** -0.5
        out = torch.ops.repro.grouped_decode_attention_write(q, k, v, k_new, v_new, cols,
                                                             mask.expand(B, 1, Q, k.shape[2]), sc, frontier)
        return out.transpose(1, 2)
    write_columns(k, cols, k_new)
    write_columns(v, cols, v_new)
    return grouped_sdpa(q, k, v, mask, scale, impl)


def write_columns(store: torch.Tensor, cols: torch.Tensor, new: torch.Tensor) -> None:
    """``store[:, :, cols] = new`` for ``store [B, G, S, D]`` and ``new [B, G, q, D]``: ``cols [q]`` one set of
    columns for every row (an index copy), ``[B, q]`` row b's own (a scatter; inside a compiled graph an index put,
    which inductor applies to the store in place)."""
    if cols.dim() == 2 and torch.compiler.is_compiling():
        # inductor writes an index_put_ into a graph input in place, but a scatter_ it turns into a copy of the
        # whole store and a scatter into the copy (every layer's write re-copying the stacked cache)
        B, G = store.shape[:2]
        rows = torch.arange(B, device=store.device)[:, None, None]
        groups = torch.arange(G, device=store.device)[None, :, None]
        store.index_put_((rows, groups, cols[:, None, :]), new.to(store.dtype))
    elif cols.dim() == 2:
        store.scatter_(2, cols[:, None, :, None].expand(-1, store.shape[1], -1, store.shape[3]), new.to(store.dtype))
    else:
        store.index_copy_(2, cols, new.to(store.dtype))
