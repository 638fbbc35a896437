"""The policy under context parallelism: ring attention swapped into the HF model, a CP pipeline stage.

Each of the C ranks of a CP group holds the zigzag shard of a packed microbatch
(``repro.parallel.cp_batch.PackedShard``: rank r holds chunks r and 2C-1-r of every sequence). The
policy is the same HF model with its attention swapped, through transformers' attention registry,
for ``kernels.attention.causal_attention`` (packed, load-balanced ring: K/V circulate, queries stay;
exact, with its own backward). The layout and the group reach the attention function as the
keyword arguments ``cp_layout``/``cp_group`` of the model's (or a decoder layer's) forward, which
transformers passes through to every attention call; RoPE uses the shard's in-sequence positions.

``CPPolicyStage`` is a pipeline stage (``repro.parallel.model.PolicyStage``) that runs its layers
this way on the shard of the microbatch it is given; ``repro.rl.mesh_update`` runs the joint GRPO +
draft update on a PP x CP mesh of them (its ``cp_update_worker`` is that update with PP = 1; the draft, if
any, runs its own CP attention on the same shard: ``repro.models`` drafts take the PackedShard).

    python -m pytest -q tests/rl/test_cp.py
"""
from __future__ import annotations

import torch
from torch import nn

from kernels.attention import causal_attention
from repro.parallel.model import PolicyStage
from repro.rl.warmstart import autocast_or_off

ATTN_NAME = "repro_cp_ring"


def _cp_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, cp_layout=None,
                  cp_group=None, **kwargs):
    """transformers attention function: [1, H, T, D] queries of this rank's rows -> [1, T, H, D]."""
    if cp_layout is None:
        raise ValueError("CP attention needs the shard's layout: call the model (or layer) with "
                         "cp_layout=<kernels.attention Layout> and cp_group=<group or None>")
    if query.shape[0] != 1:
        raise ValueError(f"CP attention runs one packed stream, got batch {query.shape[0]}")
    dtype = query.dtype
    if torch.is_autocast_enabled(query.device.type):     # as SDPA under autocast: one lower-precision dtype
        dtype = torch.get_autocast_dtype(query.device.type)  # (Qwen3's q/k norms hand back fp32 q and k)
    q, k, v = (t[0].transpose(0, 1).to(dtype).contiguous() for t in (query, key, value))
    out = causal_attention(q, k, v, cp_layout, cp_group, scale=scaling)
    return out.unsqueeze(0), None


def register_cp_attention() -> str:
    from transformers import AttentionInterface
    AttentionInterface.register(ATTN_NAME, _cp_attention)
    return ATTN_NAME


def use_cp_attention(module: nn.Module) -> nn.Module:
    """Point every HF config inside ``module`` (deep-copied layers carry their own) at the CP attention."""
    name = register_cp_attention()
    for sub in module.modules():
        cfg = getattr(sub, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = name
    return module


class CPPolicyStage(PolicyStage):
    """A pipeline stage whose layers run on ``self.shard`` (the running microbatch's ``PackedShard``):
    input ``[1, T_local]`` ids (first stage) or hidden ``[1, T_local, H]``; ring attention in the shard's
    group, RoPE at the shard's positions. Parameter names are ``PolicyStage``'s. With ``autocast_dtype``
    (bf16 on a GPU, as the single-process update) the layers run under ``torch.autocast`` and the stage
    returns fp32 (hidden states and logits), so the pipeline's buffers keep one dtype."""

    def __init__(self, policy, stage: int, layers: range, num_stages: int):
        super().__init__(policy, stage, layers, num_stages)
        use_cp_attention(self)
        self.shard = None
        self.mb = -1             # the microbatch being run (set with the shard)
        self.autocast_dtype: torch.dtype | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sh = self.shard
        if sh is None:
            raise RuntimeError("CPPolicyStage.forward without a shard: set stage.shard to the microbatch's "
                               "PackedShard first")
        h = self.embed_tokens(x) if self.is_first else x
        if h.shape[:2] != (1, sh.num_local):
            raise ValueError(f"stage {self.stage} got input {tuple(x.shape)}, expected [1, {sh.num_local}] "
                             "rows of this rank's shard")
        pos = sh.position_ids.to(h.device)[None]
        with autocast_or_off(h.device.type, self.autocast_dtype):
            pe = self.rotary_emb(h, pos)
            for i in self.layer_index:
                h = self.layers[str(i)](h, attention_mask=None, position_ids=pos, position_embeddings=pe,
                                        cp_layout=sh.layout, cp_group=sh.group)
            if self.is_last:
                h = self.lm_head(self.norm(h))
        return h.float() if self.autocast_dtype is not None else h
