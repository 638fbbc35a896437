"""A minimal EAGLE-3-style draft (one decoder layer) satisfying ``repro.parallel.draft_interface``.

It exists so the PP harness can be tested end to end; the full EAGLE-3 (with TTT), DFlash and
DSpark drafts live in ``repro.models`` and plug into the harness through the same ``TapDraft``
contract. At position t the draft sees the fused taps at t (``fc`` over the concatenated layer taps)
and the embedding of token t+1, runs one Qwen3 decoder layer, and is trained with soft cross-entropy
against the policy's detached next-token distribution at t+1.

    python -m repro.parallel.eagle_draft     # one forward/backward on random features
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm, Qwen3RotaryEmbedding

from repro.parallel.draft_interface import EMBED_TAP, DraftBatch, TargetFeatures, check_tap_layers


def eagle3_default_taps(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low/mid/high taps in the output convention, plus the embedding: (-1, 1, L/2-1, L-4)."""
    return check_tap_layers((EMBED_TAP, 1, num_layers // 2 - 1, num_layers - 4), num_layers)


class TinyEagleDraft(nn.Module):
    """One-layer EAGLE-3-style draft over ``policy_config``'s hidden size and vocabulary."""

    def __init__(self, policy_config: Qwen3Config, tap_layers: tuple[int, ...] | None = None, seed: int = 1):
        super().__init__()
        n = policy_config.num_hidden_layers
        self.tap_layers = check_tap_layers(tap_layers or eagle3_default_taps(n), n)
        if EMBED_TAP not in self.tap_layers:
            raise ValueError(f"TinyEagleDraft needs the embedding tap ({EMBED_TAP}); got {self.tap_layers}")
        layer_taps = [t for t in self.tap_layers if t != EMBED_TAP]
        h = policy_config.hidden_size
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.fc = nn.Linear(h * len(layer_taps), h, bias=False)
        self.in_proj = nn.Linear(2 * h, h, bias=False)
        self.layer = Qwen3DecoderLayer(policy_config, layer_idx=0)
        self.rotary = Qwen3RotaryEmbedding(policy_config)
        self.norm = Qwen3RMSNorm(h, eps=policy_config.rms_norm_eps)
        self.head = nn.Linear(h, policy_config.vocab_size, bias=False)
        torch.random.set_rng_state(gen_state)

    def draft_loss(self, features: TargetFeatures, batch: DraftBatch) -> torch.Tensor:
        if batch.policy_logits is None:
            raise ValueError("TinyEagleDraft.draft_loss needs batch.policy_logits (the teacher)")
        fused = self.fc(features.concat([t for t in self.tap_layers if t != EMBED_TAP]))[:, :-2]  # taps at t
        nxt = features.embeds[:, 1:-1]                                                             # token t+1
        x = self.in_proj(torch.cat([nxt, fused], dim=-1))
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        x = self.layer(x, attention_mask=None, position_ids=pos, position_embeddings=self.rotary(x, pos))
        logp = F.log_softmax(self.head(self.norm(x)).float(), dim=-1)
        teacher = F.softmax(batch.policy_logits[:, 1:-1].detach().float(), dim=-1)  # policy at t+1
        mask = batch.loss_mask[:, 1:-1].to(logp.dtype)
        per_pos = -(teacher * logp).sum(-1)
        return (per_pos * mask).sum() / mask.sum().clamp_min(1.0)


if __name__ == "__main__":
    from repro.parallel.model import tiny_qwen3_config
    cfg = tiny_qwen3_config()
    d = TinyEagleDraft(cfg)
    b, s, hsz = 2, 16, cfg.hidden_size
    feats = TargetFeatures({t: torch.randn(b, s, hsz) for t in d.tap_layers})
    batch = DraftBatch(torch.randint(0, cfg.vocab_size, (b, s)), torch.ones(b, s),
                       torch.randn(b, s, cfg.vocab_size))
    loss = d.draft_loss(feats, batch)
    loss.backward()
    print("taps", d.tap_layers, "loss", loss.item())
