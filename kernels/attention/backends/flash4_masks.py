"""The mask functions the flash-attn-4 backend hands to ``flash_attn.cute`` (``mask_mod``), as data and in torch.

Masked calls run on a batched layout: q [R, Sq, H, D], k/v [R, Sk, G, D]. Query row m of batch row r sees
key n where

    "interval"   lo1[r, m] <= n < hi1[r, m]                                     (prefix masks, one batch row)
    "block"      lo1[r, m] <= n < hi1[r, m]  or  (lo2[r, m] <= n < hi2[r, m] and key_ok[r, n])
                                                   (a block draft in one call: context prefix + its own block)

The per-row bounds and key validity travel as the kernel's ``aux_tensors`` (int32, rows flattened r-major:
index r * Sq + m, resp. r * Sk + n). ``reference`` is the same function in torch (the CPU stand-in's and the
tests' definition of what the CuTe function must compute); ``cute_mask`` returns the CuTe-DSL function
itself (kernels/attention/backends/flash4_cute.py), which imports the CUTLASS DSL and so only runs where
flash_attn.cute does.

    aux = aux_tensors("interval", lo, hi)                      # lo, hi: [R, Sq] int64
    allowed = reference("interval", aux, R, Sq, Sk)            # [R, Sq, Sk] bool
"""
from __future__ import annotations

import torch

MASKS = {"interval": 2, "block": 5}          # name -> number of aux tensors


def aux_tensors(name: str, lo1, hi1, lo2=None, hi2=None, key_ok=None) -> list[torch.Tensor]:
    """The int32 aux tensors of mask ``name`` from [R, Sq] bounds (and [R, Sk] key validity for "block")."""
    if name not in MASKS:
        raise ValueError(f"unknown flash4 mask {name!r}; expected one of {sorted(MASKS)}")
    flat = lambda x: x.reshape(-1).to(torch.int32).contiguous()
    if name == "interval":
        return [flat(lo1), flat(hi1)]
    if lo2 is None or hi2 is None or key_ok is None:
        raise ValueError("mask 'block' needs lo2, hi2 and key_ok")
    return [flat(lo1), flat(hi1), flat(lo2), flat(hi2), flat(key_ok)]


def reference(name: str, aux: list[torch.Tensor], R: int, Sq: int, Sk: int) -> torch.Tensor:
    """[R, Sq, Sk] bool: what the CuTe mask function ``name`` allows, computed in torch."""
    if len(aux) != MASKS.get(name, -1):
        raise ValueError(f"mask {name!r} takes {MASKS.get(name)} aux tensors, got {len(aux)}")
    n = torch.arange(Sk, device=aux[0].device)
    rows = lambda t: t.long().view(R, Sq, 1)
    m = (n >= rows(aux[0])) & (n < rows(aux[1]))
    if name == "block":
        ok = aux[4].bool().view(R, 1, Sk)
        m |= (n >= rows(aux[2])) & (n < rows(aux[3])) & ok
    return m


def cute_mask(name: str):
    """The CuTe-DSL ``mask_mod`` for ``name`` (imports the CUTLASS DSL: GPU machines with flash-attn-4)."""
    from kernels.attention.backends import flash4_cute
    return {"interval": flash4_cute.interval_mask, "block": flash4_cute.block_mask}[name]
