"""The engine's static decode loop (``cuda_graphs`` "all", "whole_drafts", "compiled", "compiled_drafts", "fused"):
policy and draft on static caches, decisions on the device, one host wait per step read one step late;
docs/engine.md says how a verify step runs."""
from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch.profiler import record_function as phase  # named ranges for torch.profiler (studies/rl_profile)

from repro.decoding.cuda_graph import GraphedCallable
from repro.decoding.sampling import proposal_noise, sample_with_noise, verify_with_noise
from repro.decoding.static_kv import VIEW_ARGS, StateCache, traced_whole
from repro.rollout.compiled_layers import compiled_layers
from repro.rollout.result import AcceptanceCounters, RolloutResult

PROMPT_BUCKET = 16     # fused mode with static compiled shapes: prompts are left-padded to a multiple of this
SHARED_POOL_CALLS = ("prefill", "step", "accept")     # a state's graphed calls whose graphs share one memory pool
OUTPUT_BUCKET = 64     # a state's output buffers grow to a multiple of this many columns (StaticDecoder.outputs)


class StaticDecoder:
    """The policy's static caches and graphed steps of one engine, per request shape (last few kept)."""

    def __init__(self, policy, num_proposals: int, *, keep_states: int = 4, compile_backend: str | None = None,
                 fused: bool = False, proposer=None, kv_storage=None):
        self.policy, self.k = policy, num_proposals
        self.kv_storage = kv_storage      # a SharedKVStorage: the policy caches' buffers, shared with other engines
        self.states = StateCache(keep_states)
        self.compile_backend = None if fused else compile_backend
        # fused: the policy step, the acceptance and (with a proposer) the draft's observe and next propose traced
        # whole into one inductor graph: one compiled call, and on a GPU one CUDA graph, per speculative step
        self.proposer = proposer if fused else None
        step = self._fused_step if self.proposer is None else self._whole_step
        backend = compile_backend or "inductor"
        self.fused = traced_whole(step, backend, device=policy.device, dynamic_ints=VIEW_ARGS) if fused else None
        # fused on a CPU: the prompt's forward with the first token (and the draft's first observe and propose)
        # compiled too, the prompt left-padded to a multiple of prompt_bucket (static shapes: one compilation per
        # bucket, not per prompt length). On a GPU the prefill, once per request, stays eager: compiling a whole
        # policy's forward takes minutes there, more than it would save
        on_cpu = policy.device.type != "cuda"
        self.prefill = (traced_whole(self._prefill_step, backend, device=policy.device, dynamic_ints=VIEW_ARGS)
                        if fused and on_cpu else None)
        # on a GPU (modes other than fused) the prefill is one captured graph per prompt bucket instead: a few
        # thousand eager launches would take longer than the decoding of a short answer
        self.prompt_bucket = PROMPT_BUCKET if self.prefill is not None or not (on_cpu or fused) else 1
        self.graphed = ("fused",) if fused else ("prefill", "step", "accept")

    def state(self, rows: int, max_slots: int, cuda_graphs: bool) -> dict:
        """The static state (policy cache, graphs) a request of ``rows`` rows needing ``max_slots`` columns a row
        runs on: the smallest kept state of as many rows with at least as many columns (the attention view follows
        the columns written, not the cache's size), else a new one, which supersedes the smaller states of its
        rows (they are dropped: every request they would serve fits it), so a run whose prompts grow keeps one
        cache per batch, not one per size met."""
        st, _ = self.states.get_covering((rows, max_slots), lambda: self._build(rows, max_slots), size_at=1)
        for g in self.graphed:
            st[g].enabled = cuda_graphs
        return st

    def _build(self, rows: int, max_slots: int) -> dict:
        st = {"cache": self.policy.new_static_cache(rows, max_slots, storage=self.kv_storage)}
        if self.fused is not None:
            st["cache"].in_graph = True
        calls = ({"fused": (self.fused, "policy.fused_step")} if self.fused is not None else
                 {"prefill": (self._prefill_policy, "policy.prefill"), "step": (self._policy_step, "policy.step"),
                  "accept": (self._accept_step, "engine.accept")})
        for key, (fn, name) in calls.items():
            # the prefill's inputs are new tensors every request: copied into the graph's own. The prefill's graphs
            # (one per prompt bucket), the step's (one per attention view) and the accept's (one per sampling
            # setting) share one memory pool per call, so a state holds each call's largest graph's activations,
            # not their sum. Safe because a call's outputs are read before its next replay of any key (the step's
            # by the accept and the proposer's observe, the accept's by the loop, which copies what it keeps)
            st[key] = GraphedCallable(lambda *a, fn=fn, **kw: fn(st, *a, **kw), name,
                                      persistent_inputs=key != "prefill", shared_pool=key in SHARED_POOL_CALLS)
        return st

    def outputs(self, st: dict, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The state's output buffers (tokens, log-probabilities ``[R, W]``, ``W`` at least ``width``): the accept
        step writes them in place, so a captured graph needs the same tensors on every request of this shape. The
        widest buffers asked for serve every narrower request (smaller budgets replay the same graphs); a wider
        request allocates new ones, rounded up to ``OUTPUT_BUCKET`` columns."""
        have = st.get("outputs")
        if have is None or have[0].shape[1] < width:
            R, dev = st["cache"].batch, st["cache"].device
            W = -(-width // OUTPUT_BUCKET) * OUTPUT_BUCKET
            st["outputs"] = (torch.zeros(R, W, dtype=torch.long, device=dev),
                             torch.zeros(R, W, dtype=torch.float32, device=dev))
        return st["outputs"]

    @staticmethod
    def _long_buffer(st: dict, key: str, *shape: int) -> torch.Tensor:
        """The state's integer buffer ``key`` (zeros of ``shape`` when first asked for): graphs read it by address."""
        if key not in st:
            st[key] = torch.zeros(shape, dtype=torch.long, device=st["cache"].device)
        return st[key]

    def row_limit(self, st: dict) -> torch.Tensor:
        """The state's ``[]`` buffer of the request's token budget: the accept step's graphs read it by address, so
        requests of any budget (a multi-turn episode's turns) replay the same graphs."""
        return self._long_buffer(st, "limit")

    def row_pad(self, st: dict) -> torch.Tensor:
        """The state's ``[R]`` buffer of each row's left padding (the verify steps' graphs read it by address)."""
        return self._long_buffer(st, "pad", st["cache"].batch)

    def graph_status(self) -> dict:
        out = {}
        for key, st in self.states._states.items():
            for name in self.graphed:
                out[f"{st[name].name}[{key[0]}x{key[1]}]"] = st[name].status()
        return out

    def prompt_columns(self, longest: int) -> int:
        """Columns the prefill runs for a longest prompt of ``longest`` tokens (left padding fills the rest)."""
        return -(-longest // self.prompt_bucket) * self.prompt_bucket

    # -- the traced and graphed functions -------------------------------------------------------------------------
    def _prefill_step(self, st, ids, pos, live, plen, cursor, *opt, want_taps: bool, view: int, greedy: bool,
                      temperature: float, draft_views: tuple[int, int] | None = None, draft_settings: tuple = ()):
        """The prompt's forward, the first token (argmax, or a draw with the uniform ``opt`` noise) and its
        log-probability; with a proposer also its observe of the prompt and first proposals (``_round_static``).
        ``opt``: the proposer's device cursor (with a proposer), the token's noise and the propose's (sampling)."""
        opt = list(opt)
        draft_cursor = opt.pop(0) if self.proposer is not None else None
        tok_noise = [] if greedy else [opt.pop(0)]
        tok0, lp0, taps = self._prefill_policy(st, ids, pos, live, cursor, *tok_noise, want_taps=want_taps, view=view,
                                               greedy=greedy, temperature=temperature)
        if self.proposer is None:
            return tok0, lp0
        nxt = torch.cat([ids[:, 1:], tok0[:, None]], dim=1)
        proposals = self.proposer._round_static(nxt, taps, pos, live, tok0, plen, draft_cursor, *opt,
                                                views=draft_views, **dict(draft_settings))
        return tok0, lp0, *proposals

    def _prefill_policy(self, st, ids, pos, live, cursor, *noise, want_taps: bool, view: int, greedy: bool,
                        temperature: float):
        """The prompt's forward on the static cache, its first token (argmax, or a draw with the uniform ``noise``)
        and that token's log-probability, and the taps the proposer observes (empty without ``want_taps``)."""
        # the compiled layers too (modes that compile the step): eager, the prompt's forward at 64 rows was 53 ms of
        # elementwise kernels on an H100, a sixth of a no-draft rollout
        with compiled_layers(self.policy, self.compile_backend):
            out = self.policy.decode_step_static(ids, pos, st["cache"], live, want_taps=want_taps, cursor=cursor,
                                                 view=view, last_logits=True)
        tok0, lp0 = first_token(out.logits[:, -1], greedy=greedy, temperature=temperature,
                                noise=noise[0] if noise else None)
        return tok0, lp0, list(out.taps or [])

    def _policy_step(self, st, last_tok, last_pos, drafts, pad, *, want_taps: bool, view: int):
        """The verify step: the last token and the proposals at each row's frontier (a row's token at position p
        lives in column p + ``pad``, its left padding), so each step overwrites the proposals the last one
        rejected and a row's attention reads no column past its own frontier."""
        inp = torch.cat([last_tok[:, None], drafts], dim=1)
        qpos = last_pos[:, None] + torch.arange(self.k + 1, device=last_pos.device)
        with compiled_layers(self.policy, self.compile_backend):
            out = self.policy.decode_step_static(inp, qpos, st["cache"], want_taps=want_taps, view=view,
                                                 row_cols=pad[:, None] + qpos)
        return out.logits, out.taps, qpos, st["cache"].cols

    def _fused_step(self, st, last_tok, last_pos, drafts, pad, active, gen_len, out_tok, out_lp, limit, *opt,
                    want_taps: bool, view: int, **settings):
        logits, taps, qpos, cols = self._policy_step(st, last_tok, last_pos, drafts, pad, want_taps=want_taps,
                                                     view=view)
        return taps, qpos, *self._accept_step(st, logits, drafts, qpos, cols, last_pos, active, gen_len, out_tok,
                                              out_lp, limit, *opt, **settings)

    def _whole_step(self, st, last_tok, last_pos, drafts, pad, active, gen_len, out_tok, out_lp, limit,
                    draft_cursor, *opt, draft_noise: int, draft_views: tuple[int, int], draft_settings: tuple,
                    **settings):
        """``_fused_step``, then the proposer's observe of the committed tokens and its proposals for the next step
        (``StaticProposerState._round_static``); the last ``draft_noise`` of ``opt`` are the propose's draws."""
        cut = len(opt) - draft_noise
        taps, qpos, committed, valid, new_last, new_pos, new_active, new_len, hit_stop, hist = self._fused_step(
            st, last_tok, last_pos, drafts, pad, active, gen_len, out_tok, out_lp, limit, *opt[:cut], **settings)
        proposals = self.proposer._round_static(committed, taps, qpos, valid, new_last, new_pos, draft_cursor,
                                                *opt[cut:], views=draft_views, **dict(draft_settings))
        return (new_last, new_pos, new_active, new_len, hit_stop, hist, *proposals)

    def _accept_step(self, st, logits, drafts, qpos, cols, last_pos, active, gen_len, out_tok, out_lp, limit, *opt,
                     has_stop: bool, has_probs: bool, has_valid: bool, greedy: bool, temperature: float):
        opt = list(opt)
        stop = opt.pop(0) if has_stop else None
        probs = opt.pop(0) if has_probs else None
        n_valid = opt.pop(0) if has_valid else None
        acc_noise, tok_noise = (None, None) if greedy else (opt.pop(0) if self.k else None, opt.pop(0))
        k = self.k
        v = verify_with_noise(logits, drafts, probs, greedy=greedy, temperature=temperature, num_valid=n_valid,
                              accept_noise=acc_noise, token_noise=tok_noise)
        a = v.accepted
        j = torch.arange(k + 1, device=logits.device)[None, :]   # no memo: traced, one would recompile
        # committed tokens: d_1..d_a, then the policy's token at column a (columns past a are never kept)
        nxt = v.next_token[:, None]
        committed = torch.where(j == a[:, None], nxt, torch.cat([drafts, nxt], 1)) if k else nxt
        n_new = a + 1
        if v.probs is None:          # greedy: the law at temperature 1
            lp = torch.log_softmax(logits.float(), -1).gather(2, committed[:, :, None])[:, :, 0]
        else:
            lp = v.probs.gather(2, committed[:, :, None])[:, :, 0].log()
        # rows keep their tokens up to a stop token (included) and the length limit; finished rows keep none
        n_keep = torch.minimum(n_new, limit - gen_len)
        if stop is not None:
            is_stop = torch.isin(committed, stop) & (j < n_keep[:, None])
            n_keep = torch.where(is_stop.any(1), is_stop.long().argmax(1) + 1, n_keep)
            hit_stop = is_stop.any(1) & active
        else:
            hit_stop = None
        n_keep = n_keep * active
        idx = gen_len[:, None] + j                 # past each row's length: the same writes on every replay
        out_tok.scatter_(1, idx, committed)
        out_lp.scatter_(1, idx, lp)
        new_len = gen_len + n_keep
        new_active = active & (new_len < limit)
        if hit_stop is not None:
            new_active &= ~hit_stop
        # only the kept tokens' inputs stay live: rejected proposals, every new slot of a finished row, and the
        # accepted proposals past a row's stop token or length limit die (cols [R, k + 1]: each row's frontier)
        st["cache"].slots.write_rows(cols, qpos, j < n_keep[:, None])
        # per row: accepted proposals, -1 for rows not running (the counters are summed at the end)
        hist = torch.where(active, a, -1)
        if n_valid is not None:
            hist = torch.stack([hist, n_valid.long()], 0)
        new_last = committed.gather(1, a[:, None])[:, 0]
        # each row moves past the tokens it keeps: a row that ends stops just past its last one, so the loop's steps
        # past its end write dead slots beyond its tokens, within the cache policy_slots sizes
        return committed, j < n_new[:, None], new_last, last_pos + n_keep, new_active, new_len, hit_stop, hist


class RunningFlag:
    """Whether any row still runs, read one step late: ``post`` queues the flag's copy to pinned host memory,
    ``read`` waits for the one posted before the latest. The host stays a step ahead of the GPU, at the cost of
    at most one step on finished rows. On a CPU ``read`` is exact unless ``lag_on_cpu`` (tests)."""

    lag_on_cpu = False

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.lagged = self.cuda or self.lag_on_cpu
        self.flags = [torch.ones((), dtype=torch.bool, pin_memory=self.cuda) for _ in range(2)]
        self.events = [torch.cuda.Event() if self.cuda else None for _ in range(2)]
        self.posted = 0

    def post(self, active: torch.Tensor) -> None:
        i = self.posted % 2
        self.flags[i].copy_(active.any(), non_blocking=self.cuda)
        if self.cuda:
            self.events[i].record()
        self.posted += 1

    def read(self) -> bool:
        i = (self.posted - (2 if self.lagged and self.posted > 1 else 1)) % 2
        if self.cuda:
            self.events[i].synchronize()
        return bool(self.flags[i])


def count_acceptance(history: list[torch.Tensor], k: int, has_valid: bool):
    """Acceptance counters from the per-step ``[R]`` accepted counts (-1: row not running) of a request."""
    if not history:
        return AcceptanceCounters(k)
    h = torch.stack(history)                      # [steps, R] or [steps, 2, R]
    a, n_valid = (h[:, 0], h[:, 1]) if has_valid else (h, None)
    ran = a >= 0
    per_pos = [int(((a > i) & ran).sum()) for i in range(k)]
    drafts = int((n_valid * ran).sum()) if n_valid is not None else k * int(ran.sum())
    return AcceptanceCounters(k, verify_steps=int(ran.sum()), draft_tokens=drafts, accepted=int((a * ran).sum()),
                              accepted_per_pos=per_pos if k else [])


def first_token(logits: torch.Tensor, *, greedy: bool, temperature: float, noise: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The token after each prompt from the prefill's last logits ``[R, V]`` (argmax, or a draw from the law at
    ``temperature`` with uniform ``noise [R, V]``) and its log-probability. Device work only (traced in fused)."""
    scaled = logits.float() / temperature
    tok = scaled.argmax(-1) if greedy else sample_with_noise(torch.softmax(scaled, -1), noise)
    return tok, torch.log_softmax(scaled, -1).gather(1, tok[:, None])[:, 0]


def generate_static(engine, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, greedy: bool,
                    temperature: float, stop_tokens: Sequence[int], seed: int, every_step: bool = False):
    """``RolloutEngine.generate`` on static caches (``cuda_graphs="all"``); the request was checked by the caller.
    ``every_step``: no early exit once every row has finished (the steps past it change no row's tokens)."""

    pol, k, dev = engine.policy, engine.k, engine.policy.device
    graphs = dev.type == "cuda" or GraphedCallable.emulate_replay     # graphs (or their CPU emulation)
    temp = 1.0 if greedy else float(temperature)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    B = len(prompts)
    lens = [len(p) for p in prompts]
    decoder = engine.static_decoder
    # before any work: a too-small cache fails here
    R, P, policy_slots, size = engine.request_shape(B, max(lens), max_new_tokens)
    st = decoder.state(R, policy_slots, graphs)
    cache = st["cache"]
    cache.start()
    compactions0 = cache.compactions
    proposer = engine.proposer
    if proposer is not None:
        proposer.prepare(R, size, cuda_graphs=graphs)

    # -- prefill (left padding; pads are dead slots; idle bucket rows repeat the first prompt, never read) ------
    rows_prompts = list(prompts) + [prompts[0]] * (R - B)
    rows_lens = lens + [lens[0]] * (R - B)
    ids = torch.zeros(R, P, dtype=torch.long)
    for i, p in enumerate(rows_prompts):
        ids[i, P - len(p):] = torch.tensor(list(p), dtype=torch.long)
    ids = ids.to(dev)
    plen = torch.tensor(rows_lens, device=dev)
    pos = torch.arange(P, device=dev)[None, :] - (P - plen)[:, None]
    live = pos >= 0
    pos = pos.clamp_min(0)
    pad = decoder.row_pad(st)             # each row's left padding: its token at position p is in column p + pad
    pad.copy_(P - plen)
    want_taps = proposer is not None and proposer.needs_taps
    # fused with a draft: each step's graph ends with the next step's proposals; the prefill's gives the first
    whole = "fused" in st and proposer is not None
    prop = None
    with phase("rollout.prefill"):
        if decoder.prefill is not None:
            opt, kw = ([] if greedy else [proposal_noise((R, pol.vocab_size), gen, dev)]), {}
            if whole:          # the first propose's draws come after the first token's
                draft_cursor, draft_views, draft_settings, draft_noise = proposer.begin_round(
                    P, batch=R, greedy=greedy, temperature=temp, generator=gen)
                opt = [draft_cursor, *opt, *draft_noise]
                kw = dict(draft_views=draft_views, draft_settings=draft_settings)
            cursor = cache.reserve(P)
            tok0, lp0, *prop = decoder.prefill(st, ids, pos, live, plen, cursor, *opt, want_taps=want_taps,
                                               view=cache.used_view(), greedy=bool(greedy), temperature=temp, **kw)
        else:
            noise = [] if greedy else [proposal_noise((R, pol.vocab_size), gen, dev)]
            cursor = cache.reserve(P)
            prefill = st["prefill"] if "prefill" in st else functools.partial(decoder._prefill_policy, st)
            tok0, lp0, taps = prefill(ids, pos, live, cursor, *noise, want_taps=want_taps, view=cache.used_view(),
                                      greedy=bool(greedy), temperature=temp)
            if proposer is not None:
                proposer.observe(torch.cat([ids[:, 1:], tok0[:, None]], dim=1), taps, pos, live)
            if whole:
                prop = proposer.propose(tok0, plen, greedy=greedy, temperature=temp, generator=gen)

    # -- device state -----------------------------------------------------------------------------------------
    out_tok, out_lp = decoder.outputs(st, max_new_tokens + k + 1)
    limit = decoder.row_limit(st)
    limit.fill_(max_new_tokens)
    out_tok[:, 0], out_lp[:, 0] = tok0, lp0
    stops = sorted({int(s) for s in stop_tokens})
    stop = torch.tensor(stops, dtype=torch.long, device=dev) if stops else None
    stopped = torch.isin(tok0, stop) if stop is not None else torch.zeros(R, dtype=torch.bool, device=dev)
    real = torch.arange(R, device=dev) < B
    active = real & ~stopped & (max_new_tokens > 1)
    gen_len = torch.ones(R, dtype=torch.long, device=dev)
    last_tok, last_pos = tok0.clone(), plen.clone()
    no_drafts = torch.zeros(R, 0, dtype=torch.long, device=dev)
    history: list[torch.Tensor] = []
    forwards = 1
    running = RunningFlag(dev)
    running.post(active)
    for _ in range(max_new_tokens - 1):
        with phase("rollout.wait"):
            if not running.read() and not every_step:     # the flag of the step before the last one queued
                break
        n_valid = probs = None
        if proposer is not None:
            if not whole:
                with phase("rollout.propose"):
                    prop = proposer.propose(last_tok, last_pos, greedy=greedy, temperature=temp, generator=gen)
            drafts, probs = prop[0], prop[1]
            n_valid = prop[2] if len(prop) > 2 else None
        else:
            drafts = no_drafts
        noise = [] if greedy else ([proposal_noise((R, k), gen, dev)] if k else []) + [
            proposal_noise((R, pol.vocab_size), gen, dev)]
        view = cache.grow_view(k + 1)        # covers every row's frontier: each moves at most k + 1 a step
        opt = [x for x in (stop, probs, n_valid) if x is not None] + noise
        settings = dict(has_stop=stop is not None, has_probs=probs is not None, has_valid=n_valid is not None,
                        greedy=bool(greedy), temperature=temp)
        # the fused modes' one call per step holds the acceptance too (and, with a draft, its observe and next
        # propose): the profile names it all rollout.verify
        if whole:      # the next propose's draws come after this step's, as in the other modes
            draft_cursor, draft_views, draft_settings, draft_noise = proposer.begin_round(
                k + 1, batch=R, greedy=greedy, temperature=temp, generator=gen)
            with phase("rollout.verify"):
                new_last, new_pos, new_active, new_len, hit_stop, hist, *prop = st["fused"](
                    last_tok, last_pos, drafts, pad, active, gen_len, out_tok, out_lp, limit, draft_cursor, *opt,
                    *draft_noise, want_taps=want_taps, view=view, draft_noise=len(draft_noise),
                    draft_views=draft_views, draft_settings=draft_settings, **settings)
        elif "fused" in st:
            with phase("rollout.verify"):
                taps, qpos, committed, valid, new_last, new_pos, new_active, new_len, hit_stop, hist = st["fused"](
                    last_tok, last_pos, drafts, pad, active, gen_len, out_tok, out_lp, limit, *opt, want_taps=want_taps,
                    view=view, **settings)
        else:
            with phase("rollout.verify"):
                logits, taps, qpos, cols = st["step"](last_tok, last_pos, drafts, pad, want_taps=want_taps,
                                                      view=view)
            with phase("rollout.accept"):
                committed, valid, new_last, new_pos, new_active, new_len, hit_stop, hist = st["accept"](
                    logits, drafts, qpos, cols, last_pos, active, gen_len, out_tok, out_lp, limit, *opt, **settings)
        forwards += 1
        if proposer is not None and not whole:
            with phase("rollout.observe"):
                proposer.observe(committed, taps, qpos, valid)
        last_tok.copy_(new_last)
        last_pos.copy_(new_pos)
        if hit_stop is not None:
            stopped |= hit_stop
        gen_len.copy_(new_len)
        active.copy_(new_active)
        history.append(hist.clone())       # a graph's output is overwritten by the next replay
        running.post(active)

    # -- back to the host, once ---------------------------------------------------------------------------------
    with phase("rollout.wait"):
        n = gen_len[:B].tolist()
        toks_all, lps_all, stop_all = out_tok[:B].tolist(), out_lp[:B].tolist(), stopped[:B].tolist()
    counters = count_acceptance(history, k, has_valid=bool(history) and history[0].dim() == 2)
    return RolloutResult([t[:m] for t, m in zip(toks_all, n)], [x[:m] for x, m in zip(lps_all, n)],
                         ["stop" if s else "length" for s in stop_all], counters, forwards,
                         cache.compactions - compactions0, cache.max_slots)
