"""The GRPO policy update under context parallelism: packed zigzag shards, ring attention, summed gradients.

Each of the C ranks of a CP group holds the zigzag shard of the packed batch
(``kernels.attention.make_layout``: rank r holds chunks r and 2C-1-r of every sequence). The policy is
the same HF model with its attention swapped, through transformers' attention registry, for
``kernels.attention.causal_attention`` (packed, load-balanced ring: K/V circulate, queries stay;
exact, with its own backward); RoPE uses the shard's in-sequence positions. Each local row ``i``
predicts the next token of its sequence, which every rank can name because it holds the full ids,
so the clipped GRPO loss of a shard needs no communication; its parameter gradients are summed over
the group, the global norm is clipped, and every rank takes the same AdamW step as the
single-process ``JointUpdate`` (tests/rl/test_cp.py checks the parameters match).

The draft is not sharded here: its branch attention under CP is ``kernels.attention``'s
``eagle3_ttt_attention``/``block_draft_attention`` with a group, which the draft modules do not take
yet; a config with a draft is refused with that reason.

    from kernels.launch import spawn
    out = spawn(cp_update_worker, 2, args=(payload,))      # payload: repro.rl.pp.make_payload(...)
"""
from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from kernels.attention import causal_attention, make_layout
from repro.rl.config import ConfigError, RunConfig
from repro.rl.grpo import clipped_policy_loss
from repro.rl.warmstart import make_policy

ATTN_NAME = "repro_cp_ring"
_ctx = threading.local()


def _cp_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: [1, H, T, D] queries of this rank's rows -> [1, T, H, D]."""
    if query.shape[0] != 1:
        raise ValueError(f"CP attention runs one packed stream, got batch {query.shape[0]}")
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    out = causal_attention(q, k, v, _ctx.layout, _ctx.group, scale=scaling)
    return out.unsqueeze(0), None


def register_cp_attention() -> str:
    from transformers import AttentionInterface
    AttentionInterface.register(ATTN_NAME, _cp_attention)
    return ATTN_NAME


def pack(ids: torch.Tensor, att: torch.Tensor, *cols: torch.Tensor):
    """Right-padded [B, T] rows -> packed real tokens, cu_seqlens, and each extra column packed alike."""
    lens = att.long().sum(1)
    keep = att.bool()
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
    return ids[keep], cu, [c[keep] for c in cols]


def cp_update_worker(rank: int, world: int, payload: dict) -> dict:
    """One rank of a CP=world GRPO update (no draft); returns the updated parameters."""
    cfg = RunConfig.from_dict(payload["cfg"]).validate()
    if cfg.draft is not None:
        raise ConfigError("config draft is invalid under repro.rl.cp: expected no draft (the draft modules do not "
                          "take a CP group yet; their CP attention lives in kernels.attention)")
    group = dist.group.WORLD
    ids, mask, old, adv = payload["ids"], payload["mask"], payload["old"], payload["adv"]
    att = payload["att"]
    B, T = ids.shape
    packed, cu, (p_mask, p_old, p_adv) = pack(ids, att, mask, old, adv[:, None].expand(B, T))
    lay = make_layout(cu, group)
    g = lay.global_rows()                                    # real row of each local row, -1 on pads
    doc_end = cu[1:][lay.doc_id]                             # end of each local row's sequence
    nxt = g + 1
    ok = (g >= 0) & (nxt < doc_end)
    nxt = torch.where(ok, nxt, torch.zeros_like(nxt))
    labels, m = packed[nxt], p_mask[nxt] * ok
    o, a = p_old[nxt], p_adv[nxt]
    policy = make_policy(cfg.policy, cfg.vocab_size, seed=cfg.seed, dtype=torch.float32, device="cpu")
    policy.model.load_state_dict(payload["policy"])
    policy.model.set_attn_implementation(register_cp_attention())
    _ctx.layout, _ctx.group = lay, group
    local_ids = lay.shard(packed)
    logits = policy.model(input_ids=local_ids[None], position_ids=lay.position_ids[None], use_cache=False).logits[0]
    lp = torch.log_softmax(logits.float() / cfg.grpo.temperature, -1).gather(1, labels[:, None])[:, 0]
    n_tok = float(mask.sum())
    # per-token advantages are constant per sequence: the row-wise API takes them as [rows] with T = 1
    loss, _ = clipped_policy_loss(lp[:, None], o[:, None], a, m[:, None].float(), n_tok, cfg.grpo.clip_eps)
    loss.backward()
    params = [p for p in policy.model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, group=group)
    torch.nn.utils.clip_grad_norm_(params, cfg.grpo.max_grad_norm)
    grads = {n: p.grad.detach().clone() for n, p in policy.model.named_parameters()}
    opt = torch.optim.AdamW([{"params": params, "lr": cfg.grpo.lr}], betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    opt.step()
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)
    return {"rank": rank, "policy": {n: p.detach().clone() for n, p in policy.model.named_parameters()},
            "grads": grads, "policy_loss": float(total), "local_rows": lay.num_local}
