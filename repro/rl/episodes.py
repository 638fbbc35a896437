"""Rollouts of both workloads through the (speculative) rollout engine, returned as one training batch.

``math_rollout`` samples ``G`` responses per prompt in one batched ``RolloutEngine.generate`` call
and scores them with DAPO's rule. ``workplace_rollout`` runs multi-turn episodes: each turn the
engine generates until ``</call>`` or end of sequence; the calls of all live episodes are executed
concurrently (each after the tool latency), their observations are appended as ``<obs>...</obs>``
tokens that the policy did not write (loss mask 0), and the next turn continues the conversation
(re-prefilled: the engine keeps no prefix cache across generate calls).

The returned ``RolloutBatch`` holds right-padded token ids, the loss mask of policy-written tokens,
the engine's log-probabilities of those tokens (for the importance ratio and the train-inference
KL), rewards, acceptance counters summed over every generate call, and the timings.

    batch = math_rollout(engine, tok, problems, group_size=4, max_new_tokens=48, temperature=1.0, seed=0)
"""
from __future__ import annotations

import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence

import torch

from repro.rl.tasks.math import MathProblem, dapo_reward
from repro.rl.tasks.workplace import WorkplaceEnv, WorkplaceTask
from repro.rl.tokenizer import WorkloadTokenizer
from repro.rollout.engine import RolloutEngine


@dataclass
class Counters:
    """Speculative-decoding counters summed over generate calls (vLLM's definitions)."""

    verify_steps: int = 0
    accepted: int = 0
    draft_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def add(self, c) -> None:
        self.verify_steps += c.verify_steps
        self.accepted += c.accepted
        self.draft_tokens += c.draft_tokens
        per = list(c.accepted_per_pos)
        if len(self.accepted_per_pos) < len(per):
            self.accepted_per_pos += [0] * (len(per) - len(self.accepted_per_pos))
        for i, a in enumerate(per):
            self.accepted_per_pos[i] += a

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.verify_steps if self.verify_steps else float("nan")


@dataclass
class RolloutBatch:
    input_ids: torch.Tensor        # [B, T] long, right padded
    attention_mask: torch.Tensor   # [B, T] bool
    loss_mask: torch.Tensor        # [B, T] float: 1 where the policy wrote the token
    rollout_logp: torch.Tensor     # [B, T] float: the engine's log-prob of each policy-written token
    rewards: torch.Tensor          # [B]
    counters: Counters
    gen_tokens: int                # tokens the policy generated (the throughput numerator)
    rollout_time_s: float
    tool_time_s: float = 0.0
    policy_forwards: int = 0

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]


def chat_prompt(tok: WorkloadTokenizer, text: str) -> list[int]:
    return [tok.user_id] + tok.encode(text) + [tok.assistant_id]


def right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row of ``attention_mask [B, T]`` is ones then zeros (right padding; read it on a host copy).
    A causal forward over such rows needs no padding mask: no real position sees a later, padded one."""
    a = attention_mask.to("cpu", torch.long)
    return torch.equal(a.cummin(dim=1).values, a)


def _pack(seqs: list[list[int]], masks: list[list[float]], lps: list[list[float]], pad: int):
    """Right-padded ``[B, T]`` tensors of the rows: ids (``pad`` past each row's end), attention, loss mask and
    log-probs. One tensor per kind from the rows laid end to end: a right-padded row's positions come in row-major
    order, so a boolean-mask assignment places them (a loop of per-row tensors took milliseconds a step)."""
    lengths = torch.tensor([len(s) for s in seqs])
    B, T = len(seqs), int(lengths.max())
    att = torch.arange(T)[None, :] < lengths[:, None]
    ids = torch.full((B, T), pad, dtype=torch.long)
    lm, lp = torch.zeros(B, T), torch.zeros(B, T)
    ids[att] = torch.tensor(list(itertools.chain.from_iterable(seqs)), dtype=torch.long)
    lm[att] = torch.tensor(list(itertools.chain.from_iterable(masks)), dtype=torch.float32)
    lp[att] = torch.tensor(list(itertools.chain.from_iterable(lps)), dtype=torch.float32)
    return ids, att, lm, lp


def math_rollout(engine: RolloutEngine, tok: WorkloadTokenizer, problems: Sequence[MathProblem], *,
                 group_size: int, max_new_tokens: int, temperature: float, seed: int,
                 greedy: bool = False, every_step: bool = False) -> RolloutBatch:
    """``group_size`` sampled responses per problem (groups consecutive), scored by DAPO's rule. ``every_step``:
    the engine runs every step the request could take (a warm-up's; ``RolloutEngine.generate``)."""
    encoded = [chat_prompt(tok, p.prompt_text) for p in problems]      # once per problem, not per sample
    prompts = [list(e) for e in encoded for _ in range(group_size)]
    t0 = time.perf_counter()
    extra = {"every_step": True} if every_step else {}      # only the suite's engine has it (not the vLLM backend)
    out = engine.generate(prompts, max_new_tokens=max_new_tokens, greedy=greedy, temperature=temperature,
                          stop_tokens=[tok.eos_id], seed=seed, **extra)
    elapsed = time.perf_counter() - t0
    answers = [p.answer for p in problems for _ in range(group_size)]
    rewards = torch.tensor([dapo_reward(tok.decode(t), a) for t, a in zip(out.tokens, answers)])
    seqs = [p + t for p, t in zip(prompts, out.tokens)]
    masks = [[0.0] * len(p) + [1.0] * len(t) for p, t in zip(prompts, out.tokens)]
    lps = [[0.0] * len(p) + list(l) for p, l in zip(prompts, out.logprobs)]
    ids, att, lm, lp = _pack(seqs, masks, lps, tok.pad_id)
    counters = Counters()
    counters.add(out.counters)
    return RolloutBatch(ids, att, lm, lp, rewards, counters, sum(len(t) for t in out.tokens), elapsed,
                        policy_forwards=out.policy_forwards)


def _call_text(tok: WorkloadTokenizer, turn: list[int]) -> str:
    """The text of the last ``<call>...</call>`` of a turn (malformed if there is no ``<call>``)."""
    if tok.call_id not in turn:
        return "<missing call>"
    start = len(turn) - 1 - turn[::-1].index(tok.call_id)
    body = turn[start + 1:]
    if body and body[-1] == tok.call_end_id:
        body = body[:-1]
    return tok.decode(body)


def workplace_rollout(engine: RolloutEngine, tok: WorkloadTokenizer, tasks: Sequence[WorkplaceTask], *,
                      group_size: int, max_new_tokens: int, temperature: float, seed: int,
                      tool_latency_s: float = 0.0, max_tool_calls: int = 4, greedy: bool = False,
                      pool: ThreadPoolExecutor | None = None) -> RolloutBatch:
    """Multi-turn episodes, ``group_size`` per task; ``max_new_tokens`` bounds the policy's tokens per episode."""
    envs = [WorkplaceEnv(t, tool_latency_s, max_tool_calls) for t in tasks for _ in range(group_size)]
    encoded = [chat_prompt(tok, t.prompt_text) for t in tasks]        # once per task, in the order of envs
    seqs = [list(e) for e in encoded for _ in range(group_size)]      # each episode's own, extended per turn
    masks = [[0.0] * len(s) for s in seqs]
    lps = [[0.0] * len(s) for s in seqs]
    written = [0] * len(envs)
    live = list(range(len(envs)))
    counters, forwards, tool_time, turn = Counters(), 0, 0.0, 0
    own_pool = pool is None
    pool = pool or ThreadPoolExecutor(max_workers=max(1, min(32, len(envs))))
    t0 = time.perf_counter()
    try:
        while live:
            budget = [max_new_tokens - written[i] for i in live]
            out = engine.generate([seqs[i] for i in live], max_new_tokens=max(1, max(budget)), greedy=greedy,
                                  temperature=temperature, stop_tokens=[tok.eos_id, tok.call_end_id],
                                  seed=seed * 1009 + turn)
            counters.add(out.counters)
            forwards += out.policy_forwards
            calls = []
            for i, toks, lp, b in zip(live, out.tokens, out.logprobs, budget):
                toks, lp = toks[:b], lp[:b]                 # rows share one limit; keep each in its budget
                seqs[i] += toks
                masks[i] += [1.0] * len(toks)
                lps[i] += list(lp)
                written[i] += len(toks)
                if toks and toks[-1] == tok.call_end_id and not envs[i].exhausted and written[i] < max_new_tokens:
                    calls.append((i, _call_text(tok, toks)))
            ts = time.perf_counter()
            observations = list(pool.map(lambda ic: envs[ic[0]].step(ic[1]), calls))
            tool_time += time.perf_counter() - ts
            live = []
            for (i, _), obs in zip(calls, observations):
                o = [tok.obs_id] + tok.encode(obs) + [tok.obs_end_id]
                seqs[i] += o
                masks[i] += [0.0] * len(o)
                lps[i] += [0.0] * len(o)
                live.append(i)
            turn += 1
    finally:
        if own_pool:
            pool.shutdown()
    elapsed = time.perf_counter() - t0
    rewards = torch.tensor([e.reward() for e in envs])
    ids, att, lm, lp = _pack(seqs, masks, lps, tok.pad_id)
    return RolloutBatch(ids, att, lm, lp, rewards, counters, sum(written), elapsed, tool_time, forwards)
