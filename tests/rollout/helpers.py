"""Test-only proposers: an oracle that proposes the policy's own greedy tokens, and a noisy one; and a wrong
verifier, the negative control of the sampler-law checks.

Both recompute the policy on the whole committed sequence without a cache, so they are independent
of the engine's KV bookkeeping. ``NoisyProposer`` samples from ``softmax((logits + noise) / T)``, an
imperfect draft whose proposals get rejected often enough to exercise the residual path. ``step_logits`` is a
prefill decode step's logits on a fresh cache (the decode block's tests compare them inside and outside it).
"""
from __future__ import annotations

import torch

from repro.decoding import sampling
from repro.decoding.kv import SlotTable


def step_logits(pol, ids):
    """A prefill decode step's logits on a fresh cache."""
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        return pol.decode_step(ids, pos, pol.new_cache(), SlotTable(ids.shape[0], ids.device)).logits


class OracleProposer:
    needs_taps = False

    def __init__(self, policy, k: int, prompts, noise: float = 0.0, seed: int = 1):
        self.policy, self.num_proposals, self.prompts = policy, k, [list(p) for p in prompts]
        self.noise = noise
        self.noise_gen = torch.Generator().manual_seed(seed)

    def reset(self, batch: int) -> None:
        assert batch == len(self.prompts)
        self.seqs = [list(p) for p in self.prompts]

    def observe(self, next_tokens, taps, positions, valid) -> None:
        for r in range(next_tokens.shape[0]):
            for c in range(next_tokens.shape[1]):
                if valid[r, c]:
                    p = int(positions[r, c]) + 1
                    seq = self.seqs[r]
                    if p < len(seq):
                        assert seq[p] == int(next_tokens[r, c]), "observe disagrees with the prompt"
                    else:
                        assert p == len(seq), f"gap in observed positions: {p} vs {len(seq)}"
                        seq.append(int(next_tokens[r, c]))

    def select(self, rows) -> None:
        self.seqs = [self.seqs[i] for i in rows.tolist()]

    @torch.no_grad()
    def propose(self, last_token, last_pos, *, greedy, temperature, generator):
        B, k, V = len(self.seqs), self.num_proposals, self.policy.vocab_size
        toks = torch.zeros(B, k, dtype=torch.long)
        probs = torch.zeros(B, k, V)
        seqs = [list(s) for s in self.seqs]
        for r in range(B):
            assert len(seqs[r]) == int(last_pos[r]) + 1 and seqs[r][-1] == int(last_token[r])
        groups: dict[int, list[int]] = {}
        for r, s in enumerate(seqs):
            groups.setdefault(len(s), []).append(r)
        for rows in groups.values():                     # rows of equal length run as one batch
            cur = torch.tensor([seqs[r] for r in rows])
            for i in range(k):
                logits = self.policy.model(cur).logits[:, -1].float()
                if self.noise:
                    logits = logits + self.noise * torch.randn(logits.shape, generator=self.noise_gen)
                if greedy:
                    t = logits.argmax(-1)
                else:
                    q = torch.softmax(logits / temperature, -1)
                    t = torch.multinomial(q, 1, generator=generator)[:, 0]
                    probs[rows, i] = q
                toks[rows, i] = t
                cur = torch.cat([cur, t[:, None]], dim=1)
        return toks, (None if greedy else probs)


def verify_skipping_the_residual(policy_logits, draft_tokens, draft_probs, *, greedy, temperature=1.0,
                                 generator=None, num_valid=None):
    """``sampling.verify``, except that after a rejection it resamples from the policy's law instead of the residual
    max(0, p - q): a biased sampler. Patch it in as ``repro.rollout.engine.verify``."""
    v = sampling.verify(policy_logits, draft_tokens, draft_probs, greedy=greedy, temperature=temperature,
                        generator=generator, num_valid=num_valid)
    if greedy or draft_probs is None or draft_tokens.shape[1] == 0:
        return v
    p = sampling.probs_from_logits(policy_logits, temperature)[torch.arange(len(v.accepted)), v.accepted]
    limit = num_valid if num_valid is not None else torch.full_like(v.accepted, draft_tokens.shape[1])
    redraw = torch.multinomial(p, 1, generator=generator).squeeze(1)
    return sampling.Verdict(v.accepted, torch.where(v.accepted < limit, redraw, v.next_token))
