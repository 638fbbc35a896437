"""A synthetic language and a short pre-training, so a random-initialised policy has something to say.

No checkpoints reach the CPU tests or the lent GPU, and a freshly initialised transformer predicts a
near-uniform distribution: no draft can learn that, and acceptance lengths would measure nothing.
``MarkovLanguage`` is an order-1 Markov chain over ``num_tokens`` ids of the vocabulary: each token
has ``branching`` successors with skewed probabilities (default 0.6/0.25/0.1/0.05, entropy ~1.1 nats).
``pretrain_policy`` fits the policy to it with next-token cross entropy for a few hundred steps; the
policy then has a peaked, context-dependent distribution, like a real model on real text, and
``decode``'s drafts are trained on the policy's own samples as in the paper.

    lang = MarkovLanguage(vocab_size=128, num_tokens=120, seed=0)
    losses = pretrain_policy(policy, lang, steps=200, batch_size=16, seq_len=64)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

DEFAULT_PROBS = (0.6, 0.25, 0.1, 0.05)


class MarkovLanguage:
    def __init__(self, vocab_size: int, num_tokens: int, seed: int = 0, probs=DEFAULT_PROBS):
        if not 2 <= num_tokens <= vocab_size:
            raise ValueError(f"num_tokens must be in [2, vocab_size={vocab_size}], got {num_tokens}")
        if len(probs) > num_tokens:
            raise ValueError(f"branching {len(probs)} exceeds num_tokens {num_tokens}")
        g = torch.Generator().manual_seed(seed)
        self.vocab_size, self.num_tokens = vocab_size, num_tokens
        self.tokens = torch.randperm(vocab_size, generator=g)[:num_tokens]          # ids the language uses
        succ = torch.stack([torch.randperm(num_tokens, generator=g)[:len(probs)] for _ in range(num_tokens)])
        self.successors = succ                                                      # [n, b] local indices
        self.probs = torch.tensor(probs, dtype=torch.float64) / sum(probs)

    def entropy(self) -> float:
        return float(-(self.probs * self.probs.log()).sum())

    def sample(self, n: int, length: int, seed: int) -> torch.Tensor:
        """``[n, length]`` token ids."""
        g = torch.Generator().manual_seed(seed)
        cur = torch.randint(self.num_tokens, (n,), generator=g)
        out = [cur]
        for _ in range(length - 1):
            pick = torch.multinomial(self.probs.expand(n, -1), 1, generator=g)[:, 0]
            cur = self.successors[cur, pick]
            out.append(cur)
        return self.tokens[torch.stack(out, 1)]


def pretrain_policy(policy, lang: MarkovLanguage, *, steps: int, batch_size: int, seq_len: int,
                    lr: float = 1e-3, seed: int = 0) -> list[float]:
    """Next-token cross entropy on fresh samples of ``lang`` with AdamW; returns the losses."""
    model = policy.model
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, steps // 10)))
    losses = []
    for step in range(steps):
        x = lang.sample(batch_size, seq_len, seed=seed * 100003 + step).to(policy.device)
        logits = model(x).logits
        loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses
