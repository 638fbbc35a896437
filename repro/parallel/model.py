"""A transformers Qwen3 decoder cut into pipeline stages, the way Megatron cuts layers.

``build_policy`` makes a random-initialised ``Qwen3ForCausalLM`` (tiny on CPU, any size on GPU);
``PolicyStage`` holds stage ``s``'s share of it: the embedding on the first stage, a contiguous
slice of decoder layers, and the final norm and LM head on the last. Stage modules share nothing:
each computes its own rotary embeddings from positions, and attention is SDPA with a causal mask.
Running every stage in order on one process is the single-process reference of the PP harness.

    python -m repro.parallel.model          # checks the stages against the unsplit model
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from repro.parallel.partition import split_layers, stage_of_tap  # noqa: F401 (re-exported)


def tiny_qwen3_config(num_layers: int = 8, hidden: int = 32, heads: int = 4, kv_heads: int = 2,
                      vocab: int = 64, intermediate: int = 64, max_positions: int = 512) -> Qwen3Config:
    """A small random Qwen3 config (the CPU default); pass larger values on a GPU."""
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=hidden // heads, max_position_embeddings=max_positions,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    return cfg


def build_policy(config: Qwen3Config, seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()  # eval: no dropout; gradients still flow
    return model


class PolicyStage(nn.Module):
    """Stage ``stage`` of ``num_stages``: [embedding] -> layers[lo:hi] -> [norm, lm_head].

    First stage: ``forward(input_ids [b, s]) -> hidden [b, s, H]``; middle: hidden -> hidden;
    last: hidden -> logits [b, s, V]. The decoder layers keep their global index in
    ``self.layer_index`` (module name ``layers.<global index>``) so taps can name them.
    """

    def __init__(self, policy: Qwen3ForCausalLM, stage: int, layers: range, num_stages: int):
        super().__init__()
        self.stage, self.num_stages = stage, num_stages
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1
        base = policy.model
        self.embed_tokens = copy.deepcopy(base.embed_tokens) if self.is_first else None
        self.layers = nn.ModuleDict({str(i): copy.deepcopy(base.layers[i]) for i in layers})
        self.layer_index = tuple(layers)
        self.rotary_emb = copy.deepcopy(base.rotary_emb)
        self.norm = copy.deepcopy(base.norm) if self.is_last else None
        self.lm_head = copy.deepcopy(policy.lm_head) if self.is_last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(x) if self.is_first else x
        pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        pe = self.rotary_emb(h, pos)
        for i in self.layer_index:
            h = self.layers[str(i)](h, attention_mask=None, position_ids=pos, position_embeddings=pe)
        if self.is_last:
            h = self.lm_head(self.norm(h))
        return h


def build_stages(policy: Qwen3ForCausalLM, num_stages: int, first: int | None = None,
                 last: int | None = None) -> list[PolicyStage]:
    ranges = split_layers(policy.config.num_hidden_layers, num_stages, first, last)
    return [PolicyStage(policy, s, r, num_stages) for s, r in enumerate(ranges)]


if __name__ == "__main__":
    cfg = tiny_qwen3_config()
    policy = build_policy(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    with torch.no_grad():
        ref = policy(ids).logits
        h = ids
        for st in build_stages(policy, 4):
            h = st(h)
    print("max |stages - unsplit| =", (h - ref).abs().max().item())
