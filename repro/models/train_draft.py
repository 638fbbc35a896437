"""Train a draft offline on the policy's own samples (the CPU tests and the one-GPU decode benchmark).

The samples come from the plain engine (``repro.rollout.samples.sample_sequences``); a training step runs the policy
forward on a
minibatch (taps and logits, detached), then the draft's ``draft_loss`` through the
``repro.parallel.draft_interface`` contract (``TargetFeatures`` + ``DraftBatch``), the same call the
co-training loop makes. ``loss_mask[t] = 1`` when ``x_{t+1}`` is a response token (the prediction made
at position t counts).

    seqs, plens = sample_sequences(policy, prompts, max_new_tokens=64)   # repro.rollout.samples
    losses = train_draft(draft, policy, seqs, plens, steps=200, lr=1e-3)
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from repro.parallel.draft_interface import DraftBatch, TargetFeatures


def policy_batch(policy, seqs: Sequence[Sequence[int]], plens: Sequence[int]):
    """Right-padded ids, attention and loss masks, and the policy's detached taps/logits."""
    dev = policy.device
    S = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), S, dtype=torch.long, device=dev)
    attn = torch.zeros(len(seqs), S, dtype=torch.long, device=dev)
    loss_mask = torch.zeros(len(seqs), S, device=dev)
    for i, (s, p) in enumerate(zip(seqs, plens)):
        ids[i, :len(s)] = torch.tensor(s, device=dev)
        attn[i, :len(s)] = 1
        loss_mask[i, p - 1:len(s) - 1] = 1
    with torch.no_grad():
        out = policy.forward_train(ids, want_taps=True, attention_mask=attn)
    spec = policy.tap_spec
    feats = TargetFeatures(dict(zip(spec.as_output_layers(), out.taps)))
    return feats, DraftBatch(input_ids=ids, loss_mask=loss_mask, policy_logits=out.logits.detach())


def train_draft(draft, policy, seqs, plens, *, steps: int, lr: float = 1e-3, batch_size: int = 16,
                seed: int = 0, log_every: int = 0, fallback_backend: str | None = None) -> list[float]:
    """AdamW on the draft's trainable parameters; returns the loss of every step.

    With ``fallback_backend``, a first step whose attention backend raises is retried once with that
    ``kernels.attention`` backend (printed, and left in ``draft.attn_backend`` for the caller to record).
    """
    if policy.tap_spec is None or policy.tap_spec.as_output_layers() != tuple(draft.tap_spec.as_output_layers()):
        policy.set_taps(draft.tap_spec)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        idx = torch.randint(len(seqs), (min(batch_size, len(seqs)),), generator=g).tolist()
        feats, batch = policy_batch(policy, [seqs[i] for i in idx], [plens[i] for i in idx])
        batch.extras["anchor_generator"] = g   # DFlash/DSpark anchors, reproducible
        try:
            loss = draft.draft_loss(feats, batch)
        except (RuntimeError, ValueError, TypeError) as exc:
            if step or fallback_backend is None or draft.attn_backend == fallback_backend:
                raise
            print(f"attention backend {draft.attn_backend!r} failed ({type(exc).__name__}: {exc}); "
                  f"retrying with {fallback_backend!r}", flush=True)
            draft.attn_backend = fallback_backend
            loss = draft.draft_loss(feats, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if log_every and step % log_every == 0:
            print(f"step {step}: draft loss {losses[-1]:.4f}", flush=True)
    return losses
