"""transformers' grouped-GEMM experts with their weights in the autocast dtype: the MoE policy's update at bf16 speed.

The RL update runs bf16 autocast over fp32 master weights. transformers' ``grouped_mm`` experts cast the tokens to
the weights' dtype, and torch's grouped GEMM is not an autocast op, so there the experts' GEMMs run in fp32, which
on CUDA is torch's per-group fallback (a GEMM and a host sync per expert) instead of its grouped kernel.
``grouped_mm_autocast``, registered in transformers' experts registry (``ALL_EXPERTS_FUNCTIONS``), runs the same
``grouped_mm`` forward on the experts' weights cast to the autocast dtype, as autocast does for a linear layer (the
gradients reach the fp32 weights through the cast). Outside autocast, and on weights already in the autocast dtype
(the rollout engine's bf16 copy), it is ``grouped_mm`` itself.

``use_autocast_experts(model)`` selects it on a model whose experts run ``grouped_mm`` (``build_policy`` and
``load_policy`` do). Its bf16 grouped GEMMs also keep inductor's graph whole (one graph per decoder layer, no host
sync inside), so ``compiles_whole(model, autocast_dtype)`` tells the RL update it may compile an MoE policy's
layers as it does a dense one's. The update microbatch it speeds up is timed per implementation (and compiled) by
``studies/rl_profile/moe_experts.py``.

    from repro.models.moe_experts import use_autocast_experts
    use_autocast_experts(model)          # True: the model's experts now run grouped_mm_autocast
    compiles_whole(model, torch.bfloat16)   # True: its layers compile without graph breaks under bf16 autocast
"""
from __future__ import annotations

import torch
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, grouped_mm_experts_forward

AUTOCAST_EXPERTS = "grouped_mm_autocast"


class _WeightsCast:
    """An experts module seen with its own parameters cast to ``dtype``; every other attribute is the module's."""

    def __init__(self, module: torch.nn.Module, dtype: torch.dtype):
        self.__dict__["_module"] = module
        self.__dict__["_cast"] = {n: p.to(dtype) for n, p in module.named_parameters(recurse=False)}

    def __getattr__(self, name: str):
        cast = self.__dict__["_cast"]
        return cast[name] if name in cast else getattr(self.__dict__["_module"], name)


def grouped_mm_autocast_experts_forward(module: torch.nn.Module, hidden_states: torch.Tensor,
                                        top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' ``grouped_mm`` experts forward; under autocast on the experts' weights cast to its dtype. The
    tokens keep their dtype (the GEMM casts its input to the weights'), and so does the output."""
    kind = hidden_states.device.type
    if not torch.is_autocast_enabled(kind):
        return grouped_mm_experts_forward(module, hidden_states, top_k_index, top_k_weights)
    dtype = torch.get_autocast_dtype(kind)
    if all(p.dtype == dtype for p in module.parameters(recurse=False)):
        return grouped_mm_experts_forward(module, hidden_states, top_k_index, top_k_weights)
    with torch.autocast(kind, enabled=False):
        return grouped_mm_experts_forward(_WeightsCast(module, dtype), hidden_states, top_k_index, top_k_weights)


ALL_EXPERTS_FUNCTIONS.register(AUTOCAST_EXPERTS, grouped_mm_autocast_experts_forward)


def _has_experts(model: torch.nn.Module) -> bool:
    """Whether ``model`` has transformers' experts modules (its MoE layers)."""
    return any(type(m).__name__.endswith("Experts") for m in model.modules())


def use_autocast_experts(model: torch.nn.Module) -> bool:
    """Select ``grouped_mm_autocast`` for ``model``'s experts when they run ``grouped_mm`` (transformers' default
    where the grouped GEMM exists); other choices (``eager`` for fp64, ``batched_mm``) are left. True if selected."""
    if getattr(model.config, "_experts_implementation", None) != "grouped_mm" or not _has_experts(model):
        return False
    model.set_experts_implementation(AUTOCAST_EXPERTS)
    return True


def compiles_whole(model: torch.nn.Module, autocast_dtype: torch.dtype | None) -> bool:
    """Whether ``model``'s decoder layers compile into whole graphs under autocast to ``autocast_dtype``: always for
    a model without experts; for an MoE model only when its experts run ``grouped_mm_autocast`` and the autocast
    casts their weights to a half dtype (on fp32 weights ``grouped_mm`` falls back to one GEMM per expert with a
    host sync each, which breaks the graph at every layer)."""
    if not _has_experts(model):
        return True
    return (getattr(model.config, "_experts_implementation", None) == AUTOCAST_EXPERTS
            and autocast_dtype in (torch.bfloat16, torch.float16))
