"""A batched speculative rollout engine: chain proposals, one-forward verification, exact rejection sampling.

``RolloutEngine(policy, proposer=None).generate(prompts, ...)`` decodes a batch of prompts with a KV
cache for the policy (and the draft's own cache inside the proposer), ragged acceptance per row,
stop tokens and a length limit. Each verify step feeds ``[last token, d_1..d_k]`` through the policy
once, accepts a prefix by ``repro.decoding.sampling.verify`` and commits ``accepted + 1`` tokens.
Without a proposer (k = 0) the same loop is the plain decoding baseline.

``cuda_graphs="draft"`` runs the proposer on static caches sized for the request, replayed as CUDA graphs on a GPU;
``"all"``, ``"whole_drafts"``, ``"compiled"``, ``"compiled_drafts"`` and ``"fused"`` the policy too (docs/engine.md);
``"off"`` (default) keeps growing, compacted caches. The static policy cache is sized for the prompt, the answer
and one verify step; each row writes at its own frontier, so a step overwrites the proposals the last one rejected
(``policy_slots``). ``max_draft_slots`` caps the static cache
(slots per row; a request that needs more fails before decoding); ``bucket_batch=True`` rounds the static batch up
to a power of two (shrinking turns then share captured graphs); ``min_static_rows`` runs smaller requests on a static
batch of that many rows (a trainer's held-out rollouts on its training batch's caches); ``policy_cache_slots`` fixes
the policy cache's columns a row (at least the longest prompt + ``max_new_tokens`` + k); ``kv_storage`` (a
``SharedKVStorage``) gives the static policy caches buffers shared with other engines whose requests never overlap
with this one's (a lockstep's rows).

Returned per row: generated tokens, the policy's log-probabilities of those tokens
(``log_softmax(logits / temperature)``; temperature 1 in greedy mode), why it stopped; and counters
as vLLM and the paper count them: ``acceptance_length = 1 + accepted / verify_steps`` and
``accepted_per_pos[i]`` = verify steps whose proposal ``i`` was accepted.

    from repro.models.policy import build_policy
    from repro.rollout.engine import RolloutEngine
    out = RolloutEngine(build_policy("qwen3", "tiny")).generate([[1, 2, 3]], max_new_tokens=8, greedy=True)
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch.profiler import record_function as phase  # named ranges for torch.profiler (studies/rl_profile)

from kernels.attention.sdpa_choice import no_cudnn_sdpa
from repro.core.specs import CUDA_GRAPH_MODES
from repro.decoding.kv import SlotTable, gather_hf_cache, select_hf_cache_rows, trim_hf_cache
from repro.decoding.merged_projections import merged_projections
from repro.decoding.policy_cache import SharedKVStorage
from repro.decoding.sampling import verify
from repro.decoding.static_kv import VIEW_BUCKET, batch_bucket, bucketed, slots_needed, symbolic_views
from repro.models.policy import Policy
from repro.rollout.proposer import Proposer
from repro.rollout.result import AcceptanceCounters, RolloutResult, check_request  # noqa: F401 (re-exported)
from repro.rollout.static_loop import StaticDecoder, generate_static

log = logging.getLogger(__name__)
STATIC_MODES = CUDA_GRAPH_MODES[2:]                       # the policy on a static cache too (static_loop)
POLICY_COMPILED_MODES = ("compiled", "compiled_drafts", "fused")        # the policy's step compiled
WHOLE_DRAFT_MODES = ("whole_drafts", "compiled_drafts")  # the proposer's static propose and observe compiled whole
# ("fused" traces them inside the policy's step instead)
COMPILED_MODES = tuple(m for m in CUDA_GRAPH_MODES if m in POLICY_COMPILED_MODES + WHOLE_DRAFT_MODES)  # inductor first
BUCKETED_STATES = 16      # static states a proposer keeps when batches are bucketed (every turn shape of a request)


class RolloutEngine:
    """Speculative (or, with ``proposer=None``, plain) batched decoding for one policy."""

    def __init__(self, policy: Policy, proposer: Proposer | None = None, *, max_model_len: int = 4096,
                 cuda_graphs: str = "off", max_draft_slots: int | None = None, bucket_batch: bool = False,
                 min_static_rows: int | None = None, compile_backend: str = "inductor",
                 policy_cache_slots: int | None = None, kv_storage: SharedKVStorage | None = None):
        if cuda_graphs not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graphs={cuda_graphs!r} is invalid: expected one of {CUDA_GRAPH_MODES}")
        if bucket_batch and cuda_graphs == "off":
            raise ValueError(f"bucket_batch=True needs a cuda_graphs mode other than 'off' (one of "
                             f"{CUDA_GRAPH_MODES[1:]}): it buckets the static batch")
        if bucket_batch and proposer is not None and not hasattr(proposer, "keep_states"):
            raise ValueError(f"bucket_batch=True needs a proposer with static states (keep_states()); "
                             f"{type(proposer).__name__} has none")
        if cuda_graphs != "off" and proposer is not None and not hasattr(proposer, "prepare"):
            raise ValueError(f"cuda_graphs={cuda_graphs!r} needs a proposer with a static-cache path (prepare()); "
                             f"{type(proposer).__name__} has none")
        if min_static_rows is not None and (isinstance(min_static_rows, bool) or not isinstance(min_static_rows, int)
                                            or min_static_rows < 1):
            raise ValueError(f"min_static_rows must be an int >= 1 or None, got {min_static_rows!r}")
        if min_static_rows is not None and cuda_graphs == "off":
            raise ValueError(f"min_static_rows={min_static_rows} needs a cuda_graphs mode other than 'off' (one of "
                             f"{CUDA_GRAPH_MODES[1:]}): it sizes the static batch")
        if max_draft_slots is not None and max_draft_slots < 1:
            raise ValueError(f"max_draft_slots must be >= 1 or None, got {max_draft_slots}")
        if policy_cache_slots is not None and (isinstance(policy_cache_slots, bool)
                                               or not isinstance(policy_cache_slots, int) or policy_cache_slots < 1):
            raise ValueError(f"policy_cache_slots must be an int >= 1 or None, got {policy_cache_slots!r}")
        if policy_cache_slots is not None and cuda_graphs not in STATIC_MODES:
            raise ValueError(f"policy_cache_slots={policy_cache_slots} needs a cuda_graphs mode with the policy on a "
                             f"static cache (one of {STATIC_MODES}), got {cuda_graphs!r}")
        self.policy_cache_slots = policy_cache_slots   # the policy's static cache columns a row (None: policy_slots)
        self.cuda_graphs = cuda_graphs
        self.max_draft_slots = max_draft_slots     # cap on the static draft cache (slots per row)
        # the draft's static batch rounded up to a power of two (static_kv.batch_bucket), the extra rows idle: a
        # multi-turn rollout's shrinking batches then reuse a few captured states instead of capturing per size
        self.bucket_batch = bucket_batch and (proposer is not None or cuda_graphs in STATIC_MODES)
        if self.bucket_batch and proposer is not None:
            proposer.keep_states(BUCKETED_STATES)
        # a request of fewer rows runs on a static batch of min_static_rows (the rows past it idle): a trainer's
        # held-out rollouts then share its training batch's caches and graphs instead of holding a second set
        self.min_static_rows = min_static_rows
        self._said_cpu = False
        self.policy = policy
        self.proposer = proposer
        self.k = proposer.num_proposals if proposer is not None else 0
        if proposer is not None and proposer.needs_taps:
            if policy.recorder is None:
                raise ValueError("the draft needs policy taps but the policy has no TapSpec; call "
                                 "policy.set_taps(draft.tap_spec)")
            want = getattr(proposer, "tap_spec", None)
            have = policy.tap_spec
            if want is not None and have.as_output_layers() != want.as_output_layers():
                raise ValueError(f"the policy taps layers {have.as_output_layers()} but the draft was trained on "
                                 f"{want.as_output_layers()} (output convention); call policy.set_taps(draft.tap_spec)")
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        self.static_decoder = None
        if cuda_graphs in STATIC_MODES:
            policy_backend = compile_backend if cuda_graphs in POLICY_COMPILED_MODES else None
            self.static_decoder = StaticDecoder(policy, self.k, keep_states=BUCKETED_STATES if self.bucket_batch
                                                else 4, compile_backend=policy_backend,
                                                fused=cuda_graphs == "fused", proposer=proposer,
                                                kv_storage=kv_storage)
            if proposer is not None:
                proposer.check_steps = False      # its per-step check would be a second host sync
                proposer.compile_static = compile_backend if cuda_graphs in WHOLE_DRAFT_MODES else None
                # the prompt's observe captured per prompt width where prompts are padded to a bucket (on a GPU),
                # its ops uncompiled (a capture is cheap, a compilation per width is not) and not traced in a step
                proposer.graph_prompt_observe = (self.static_decoder.prompt_bucket > 1 and cuda_graphs != "fused"
                                                 and proposer.compile_static is None)
        self.max_model_len = max_model_len
        self.compact_every = 16           # verify steps between checks for dead slots to squeeze out
        self.compact_min_waste = 64       # ... and the fewest columns worth a compaction

    def graph_status(self) -> dict:
        """Per graphed proposer call: captures, replays, eager calls, and why capture failed (if it did)."""
        status = getattr(self.proposer, "graph_status", None)
        out = status() if status is not None else {}
        if self.static_decoder is not None:
            out.update(self.static_decoder.graph_status())
        return out

    @property
    def last_round_slots(self) -> int:
        """Columns past a request's last verify step: in the fused mode each step's graph ends with the next step's
        proposals, so the last step's proposals (an EAGLE-3 chain writes its keys) are written too."""
        if self.cuda_graphs != "fused" or self.proposer is None:
            return 0
        return getattr(self.proposer, "propose_width", 0)

    def static_rows(self, B: int) -> int:
        """Rows of the static batch a request of ``B`` rows runs on: ``B`` (a power of two with ``bucket_batch``),
        at least ``min_static_rows``."""
        rows = batch_bucket(B) if self.bucket_batch else B
        return max(rows, self.min_static_rows or 0)

    def slots_for(self, P: int, max_new_tokens: int) -> int:
        """Columns per row a request writes (longest prompt ``P``)."""
        return slots_needed(P, max_new_tokens, self.k) + self.last_round_slots

    def static_slots(self, P: int, max_new_tokens: int) -> int:
        """Columns per row of the static caches for a request (longest prompt ``P``), refused past the cap."""
        need = self.slots_for(P, max_new_tokens)
        if self.max_draft_slots is not None and need > self.max_draft_slots:
            extra = f" + {self.last_round_slots} for the last step's proposals" if self.last_round_slots else ""
            raise ValueError(f"the request needs {need} draft cache slots per row (longest prompt {P} + "
                             f"(max_new_tokens {max_new_tokens} - 1) x {self.k + 1}{extra}), over "
                             f"max_draft_slots={self.max_draft_slots}")
        return bucketed(need) if self.max_draft_slots is None else min(bucketed(need), self.max_draft_slots)

    def smallest_policy_cache(self, P: int, max_new_tokens: int) -> int:
        """The fewest policy cache columns a row that a request (longest prompt ``P``, as the prefill pads it) fits:
        the longest row's tokens (P + max_new_tokens - 1) and one step's k + 1 columns at its frontier."""
        return P + max_new_tokens + self.k

    def policy_slots(self, P: int, max_new_tokens: int) -> int:
        """Columns per row of the policy's static cache for a request (longest prompt ``P``): the prompt, the answer
        and one verify step's k + 1 columns (``policy_cache_slots`` when given, at least that many). A verify step
        writes each row's tokens at its frontier (the token at position p in column p + the row's left padding),
        so the next step overwrites the proposals it rejected: no row needs more, and no compaction."""
        need = self.smallest_policy_cache(P, max_new_tokens)
        if self.policy_cache_slots is not None:
            if self.policy_cache_slots < need:
                raise ValueError(f"policy_cache_slots={self.policy_cache_slots} is too small for the request: it "
                                 f"needs at least {need} (longest prompt {P} + max_new_tokens {max_new_tokens} + "
                                 f"k {self.k})")
            return self.policy_cache_slots
        return bucketed(need)

    def request_shape(self, B: int, longest: int, max_new_tokens: int) -> tuple[int, int, int, int] | None:
        """What the static caches and graphs of a request (``B`` prompts, the longest ``longest`` tokens) are made
        for: (static rows, prefill columns, policy cache columns, draft cache columns, 0 without a draft); None on
        an engine without static caches. Requests of one shape share buffers, captures and compilations."""
        if self.static_decoder is None:
            return None
        padded = self.static_decoder.prompt_columns(longest)
        cap = self.max_draft_slots      # padding never makes a request that fits the cap fail it
        P = padded if cap is None or self.slots_for(padded, max_new_tokens) <= cap else longest
        draft = self.static_slots(P, max_new_tokens) if self.proposer is not None else 0
        return self.static_rows(B), P, self.policy_slots(P, max_new_tokens), draft

    def _start_proposer(self, B: int, P: int, max_new_tokens: int) -> None:
        if self.cuda_graphs == "off":
            self.proposer.reset(B)
            return
        size = self.static_slots(P, max_new_tokens)
        on_gpu = self.policy.device.type == "cuda"
        if not on_gpu and not self._said_cpu:
            log.warning("cuda_graphs=%r on device %s: the draft runs eagerly on its static caches",
                        self.cuda_graphs, self.policy.device)
            self._said_cpu = True
        rows = self.static_rows(B)
        self.proposer.prepare(rows, size, cuda_graphs=on_gpu)
        if rows > B:                 # the rows past the request's idle from the start, as finished rows do
            self.proposer.select(torch.arange(B, device=self.policy.device))

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, greedy: bool = False,
                 temperature: float = 1.0, stop_tokens: Sequence[int] = (), seed: int = 0,
                 every_step: bool = False) -> RolloutResult:
        """Sample up to ``max_new_tokens`` tokens per prompt (``stop_tokens`` end a row, kept). ``every_step``
        (static-cache modes only; a warm-up's): the loop runs all ``max_new_tokens - 1`` steps a request can take,
        finished rows idle, so that each step's attention views up to the cache's size (which grow with the steps)
        are met here, with their captures and compilations, and not by a later request that runs longer. The
        tokens are the same."""
        if every_step and self.cuda_graphs not in STATIC_MODES:
            raise ValueError(f"every_step=True needs a static-cache engine (cuda_graphs one of {STATIC_MODES}), "
                             f"got cuda_graphs={self.cuda_graphs!r}")
        # decoding changes shapes every step (no cuDNN); q/k/v and gate/up as one product each (merged_projections);
        # the compiled whole steps' attention views symbolic for the request (symbolic_views)
        with no_cudnn_sdpa(self.policy.device), merged_projections(self.policy.model), symbolic_views():
            return self._generate(prompts, max_new_tokens=max_new_tokens, greedy=greedy, temperature=temperature,
                                  stop_tokens=stop_tokens, seed=seed, every_step=every_step)

    def warm_up(self, rows: int, longest: int, max_new_tokens: int, *, greedy: bool, temperature: float,
                stop_tokens: Sequence[int] = ()) -> int:
        """Run (and discard) requests that meet every graph capture and compilation a later request of at most
        ``rows`` prompts of at most ``longest`` tokens, with a budget of at most ``max_new_tokens`` and the same
        sampling settings and number of stop tokens, can meet (a multi-turn episode's turns, whose prompts are known
        only as they run). For each static batch such requests run on: one request per prompt width the prefill
        pads to (its graph is one per width), widest first (its caches serve every narrower request:
        ``StateCache.get_covering``), each for every step (``every_step``, so every attention view from its prompt
        on); where prompts are not padded (no prefill graphs), one every ``VIEW_BUCKET`` tokens, enough to meet
        every view. Prompts longer than ``max_model_len`` allows are left out, as such requests fail. Returns the
        requests run. Static-cache engines only."""
        if self.static_decoder is None:
            raise ValueError(f"warm_up needs a static-cache engine (cuda_graphs one of {STATIC_MODES}), "
                             f"got cuda_graphs={self.cuda_graphs!r}")
        if rows < 1 or longest < 1 or max_new_tokens < 1:
            raise ValueError(f"warm_up needs rows, longest and max_new_tokens >= 1, got {rows}, {longest}, "
                             f"{max_new_tokens}")
        cap = self.max_model_len - max_new_tokens - self.k       # check_request's longest prompt
        bucket = self.static_decoder.prompt_bucket
        top = self.static_decoder.prompt_columns(min(longest, cap)) if cap >= 1 else 0
        widths = sorted({min(w, cap) for w in range(top, 0, -(bucket if bucket > 1 else VIEW_BUCKET))}, reverse=True)
        batches: dict[int, int] = {}          # static rows -> the most prompts a request on them has
        for b in range(rows, 0, -1):
            batches.setdefault(self.static_rows(b), b)
        for b in batches.values():
            for w in widths:
                self.generate([[0] * w] * b, max_new_tokens=max_new_tokens, greedy=greedy, temperature=temperature,
                              stop_tokens=stop_tokens, every_step=True)
        return len(batches) * len(widths)

    def _generate(self, prompts, *, max_new_tokens, greedy, temperature, stop_tokens, seed,
                  every_step=False) -> RolloutResult:
        pol, k, dev = self.policy, self.k, self.policy.device
        check_request(prompts, max_new_tokens, greedy, temperature, num_proposals=k,
                      max_model_len=self.max_model_len, vocab_size=pol.vocab_size)
        if self.cuda_graphs in STATIC_MODES:
            if self.policy.device.type != "cuda" and not self._said_cpu:
                log.warning("cuda_graphs=%r on device %s: policy and draft run without graphs on their static caches",
                            self.cuda_graphs, self.policy.device)
                self._said_cpu = True
            return generate_static(self, prompts, max_new_tokens=max_new_tokens, greedy=greedy,
                                   temperature=temperature, stop_tokens=stop_tokens, seed=seed,
                                   every_step=every_step)
        lens = [len(p) for p in prompts]
        temp = 1.0 if greedy else float(temperature)
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
        B, P = len(prompts), max(lens)
        stop = torch.tensor(sorted({int(s) for s in stop_tokens}), dtype=torch.long, device=dev)
        if self.proposer is not None:
            self._start_proposer(B, P, max_new_tokens)      # before any work: a too-small cache fails here

        # -- prefill (left padding; pads are dead slots) -------------------------------------------------
        ids = torch.zeros(B, P, dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            ids[i, P - len(p):] = torch.tensor(list(p), dtype=torch.long)
        plen = torch.tensor(lens, device=dev)
        pos = torch.arange(P, device=dev).unsqueeze(0) - (P - plen).unsqueeze(1)
        live = pos >= 0
        pos = pos.clamp_min(0)
        cache, table = pol.new_cache(), SlotTable(B, dev)
        want_taps = self.proposer is not None and self.proposer.needs_taps
        out = pol.decode_step(ids, pos, cache, table, live, want_taps=want_taps)
        forwards = 1
        first = verify(out.logits[:, -1:], ids[:, :0], None, greedy=greedy, temperature=temp, generator=gen)
        first_tok = first.next_token
        lp_first = torch.log_softmax(out.logits[:, -1].float() / temp, -1).gather(1, first_tok[:, None])[:, 0]
        if self.proposer is not None:
            nxt = torch.cat([ids[:, 1:], first_tok[:, None]], dim=1)
            self.proposer.observe(nxt, out.taps, pos, live)

        # -- per-row outputs -----------------------------------------------------------------------------
        toks: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        reason = ["length"] * B
        counters = AcceptanceCounters(k)
        rows = torch.arange(B, device=dev)               # active row -> original index
        last_tok, last_pos = first_tok, plen.clone()      # newest committed token, its position
        step = compactions = 0
        done = self._commit(rows, first_tok[:, None], lp_first[:, None], torch.ones(B, dtype=torch.long,
                            device=dev), toks, lps, reason, max_new_tokens, stop)

        while True:
            step += 1
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            if keep.numel() < rows.numel():                # finished rows leave the batch
                rows, last_tok, last_pos = rows[keep], last_tok[keep], last_pos[keep]
                select_hf_cache_rows(cache, keep)
                table.select(keep)
                if self.proposer is not None:         # a static proposer only remaps (StaticBatch)
                    self.proposer.select(keep)
            nb = rows.numel()
            n_valid = None
            if self.proposer is not None:
                with phase("rollout.propose"):
                    prop = self.proposer.propose(last_tok, last_pos, greedy=greedy, temperature=temp,
                                                 generator=gen)
                d, q = prop[0], prop[1]
                if len(prop) > 2:                               # the draft cut some chains short
                    n_valid = prop[2]
            else:
                d, q = last_tok.new_zeros(nb, 0), None
            inp = torch.cat([last_tok[:, None], d], dim=1)
            qpos = last_pos[:, None] + torch.arange(k + 1, device=dev)
            start = table.length
            with phase("rollout.verify"):
                out = pol.decode_step(inp, qpos, cache, table, want_taps=want_taps)
            forwards += 1
            v = verify(out.logits, d, q, greedy=greedy, temperature=temp, generator=gen, num_valid=n_valid)
            a = v.accepted
            counters.add(a, n_valid)
            # committed tokens of this step: d_1..d_a then the policy's token
            j = torch.arange(k + 1, device=dev).unsqueeze(0)
            committed = torch.cat([d, d.new_zeros(nb, 1)], dim=1)
            committed = torch.where(j == a[:, None], v.next_token[:, None], committed)
            n_new = a + 1
            lp = torch.log_softmax(out.logits.float() / temp, -1).gather(2, committed[:, :, None])[:, :, 0]
            table.kill(start, n_new)                        # rejected proposals become dead slots
            tail = table.dead_tail()
            if tail:
                table.trim(table.length - tail)
                trim_hf_cache(cache, table.length)
            if step % self.compact_every == 0:              # rows that accepted less leave holes
                order = table.compact(self.compact_min_waste)
                if order is not None:
                    gather_hf_cache(cache, order)
                    compactions += 1
            if self.proposer is not None:
                with phase("rollout.observe"):
                    self.proposer.observe(committed, out.taps, qpos, j < n_new[:, None])
            last_tok = committed.gather(1, a[:, None])[:, 0]
            last_pos = last_pos + n_new
            done = self._commit(rows, committed, lp, n_new, toks, lps, reason, max_new_tokens, stop)
        return RolloutResult(toks, lps, reason, counters, forwards, compactions, table.length)

    @staticmethod
    def _commit(rows, committed, lp, n_new, toks, lps, reason, max_new, stop) -> torch.Tensor:
        """Append each active row's new tokens, cutting at a stop token or the length limit."""
        c, l, n = committed.tolist(), lp.tolist(), n_new.tolist()
        stop_set = set(stop.tolist())
        done = []
        for r, orig in enumerate(rows.tolist()):
            fin = False
            for t, x in zip(c[r][: n[r]], l[r][: n[r]]):
                toks[orig].append(t)
                lps[orig].append(x)
                if t in stop_set:
                    reason[orig], fin = "stop", True
                    break
                if len(toks[orig]) >= max_new:
                    fin = True
                    break
            done.append(fin)
        return torch.tensor(done, dtype=torch.bool, device=committed.device)
