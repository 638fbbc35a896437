"""The policy's attention on its KV caches: inside ``grouped_attention(model)`` (the decode and verify steps) a call
with a ``[B, 1, q, S]`` mask goes to ``kernels.attention.grouped.grouped_sdpa`` (registered with transformers as
``GROUPED_SDPA``), any other to transformers' SDPA. On a static cache (``slot_cache=``, from ``Policy``) the call
also writes the layer's keys/values, one kernel with the attention on the GPU path. Training forwards and the peers
keep stock ``sdpa``."""
from __future__ import annotations

import contextlib

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from kernels.attention.grouped import grouped_sdpa, grouped_sdpa_write

GROUPED_SDPA = "repro_grouped_sdpa"
GROUPED_SDPA_INLINE = "repro_grouped_sdpa_inline"


def grouped_sdpa_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, slot_cache=None,
                         **kwargs):
    """transformers' attention-function signature. With ``slot_cache`` (a ``StaticPolicyCache`` whose ``update``
    handed the step's keys/values through) ``key``/``value`` are the step's own: written here into the layer's
    cache view, in the attention kernel's launch where it takes the step."""
    m = attention_mask
    folds = m is not None and m.dim() == 4 and m.shape[1] == 1 and not dropout
    if slot_cache is not None:
        view = slot_cache.view
        k_view, v_view = slot_cache.layer(module.layer_idx, view)
        if folds and kwargs.get("position_bias") is None:
            out = grouped_sdpa_write(query, key, value, k_view, v_view, slot_cache.cols, m[:, :, :, :view],
                                     scale=scaling, frontier=slot_cache.frontier)
            return out.transpose(1, 2).contiguous(), None
        key, value = slot_cache.write(module.layer_idx, key, value)
    if not folds or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, m, dropout=dropout, scaling=scaling, **kwargs)
    out = grouped_sdpa(query, key, value, m[:, :, :, :key.shape[2]], scale=scaling)
    return out.transpose(1, 2).contiguous(), None


# eager inside a compiled decoder layer (a graph break, as the cache write before it): inductor's SDPA lowering
# copies the keys/values of a sliced cache view and pads the mask per layer, which at batch 64 over a verify step's
# k+1 queries cost more than the attention kernel itself
for _name, _fn in ((GROUPED_SDPA, torch.compiler.disable(grouped_sdpa_forward)), (GROUPED_SDPA_INLINE,
                                                                                    grouped_sdpa_forward)):
    AttentionInterface.register(_name, _fn)
    AttentionMaskInterface.register(_name, sdpa_mask)


@contextlib.contextmanager
def grouped_attention(model, inline: bool = False, static=None):
    """Inside the block, ``model`` attends through ``GROUPED_SDPA`` if it was built with ``sdpa`` (else unchanged);
    ``inline``: through ``GROUPED_SDPA_INLINE``, traced into a whole compiled forward. Yields the keyword arguments
    the model's forward takes for it: with a ``StaticPolicyCache`` ``static`` and ``GROUPED_SDPA``,
    ``slot_cache=static`` (its ``update`` hands the keys/values through and the attention writes them)."""
    cfg, built = model.config, model.config._attn_implementation
    cfg._attn_implementation = (GROUPED_SDPA_INLINE if inline else GROUPED_SDPA) if built == "sdpa" else built
    extra = {"slot_cache": static} if static is not None and cfg._attn_implementation == GROUPED_SDPA else {}
    if extra:
        static.write_on_attend = True
    try:
        yield extra
    finally:
        cfg._attn_implementation = built
        if extra:
            static.write_on_attend = False
