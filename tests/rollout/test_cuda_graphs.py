"""Static draft caches and CUDA-graph switch (``RolloutEngine(cuda_graphs="draft")``), CPU only.

The static-cache path (what the graphs replay; eager here) equals the growing-cache path for EAGLE-3,
DFlash and DSpark: identical greedy and sampled tokens, the same proposal distributions; the capture
utility falls back to eager and keys graphs by shape; bad values fail clearly.

    .venv/bin/python -m pytest -q tests/rollout/test_cuda_graphs.py
"""
import collections
import contextlib
import inspect
import logging

import pytest
import torch

from repro.decoding.cuda_graph import GraphedCallable, active_graph_pools, graph_pool_bytes, shared_graph_pools
from repro.decoding.sampling import sample_with_noise
from repro.decoding.static_kv import VIEW_BUCKET, Cursor, StaticSlots, slots_needed
from repro.models.block_draft import BlockDraftConfig, BlockProposer
from repro.models.dflash import DFlashDraft
from repro.models.dspark import DSparkDraft
from repro.models.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Proposer
from repro.models.policy import build_policy
from repro.models.train_draft import train_draft
from repro.models.vocab import build_draft_vocab
from repro.rollout.engine import CUDA_GRAPH_MODES, RolloutEngine
from repro.rollout.samples import sample_sequences
from repro.rollout.static_loop import PROMPT_BUCKET

from .helpers import OracleProposer

FAMILIES = ("eagle3", "dflash", "dspark")


@pytest.fixture(scope="module")
def trained():
    """Each family briefly trained on the tiny policy's greedy samples, so proposals get accepted."""
    pol = build_policy("qwen3", "tiny", seed=6, init_std=0.3)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 127, (4,), generator=g).tolist() for _ in range(16)]
    seqs, plens = sample_sequences(pol, prompts, max_new_tokens=24, greedy=True)
    out = {}
    for fam in FAMILIES:
        torch.manual_seed(0)
        if fam == "eagle3":    # a reduced draft vocabulary exercises the draft -> target scatter of q
            d2t, t2d = build_draft_vocab(torch.arange(pol.vocab_size, 0, -1).float(), 96)
            d = Eagle3Draft(Eagle3Config.from_policy(pol, ttt_steps=3, draft_vocab_size=96), d2t=d2t, t2d=t2d)
            d.init_from_policy(pol)
        else:
            cfg = BlockDraftConfig.from_policy(pol, num_layers=1, block_size=4, num_anchors=6)
            d = (DFlashDraft if fam == "dflash" else DSparkDraft)(cfg, pol)
        train_draft(d, pol, seqs, plens, steps=20, lr=3e-3, batch_size=8)
        out[fam] = d
    return pol, prompts, out


def proposer(d):
    return Eagle3Proposer(d, 3) if isinstance(d, Eagle3Draft) else BlockProposer(d)


def assert_same_rollout(got, want):
    """Same tokens, stop reasons and acceptance counters; log-probabilities to 1e-5."""
    assert got.tokens == want.tokens and got.finish_reason == want.finish_reason
    assert got.counters.as_dict() == want.counters.as_dict()
    torch.testing.assert_close(torch.tensor(sum(got.logprobs, [])), torch.tensor(sum(want.logprobs, [])),
                               rtol=0, atol=1e-5)


def ragged(prompts):
    ps = [list(p) for p in prompts[:6]]
    ps[2] += [7, 9, 11]          # left padding in the prefill
    ps[4] = ps[4][:2]
    return ps


@pytest.mark.timeout(60)
@pytest.mark.parametrize("family", FAMILIES)
def test_static_path_generates_what_the_growing_path_does(trained, family):
    pol, prompts, drafts = trained
    d = drafts[family]
    pol.set_taps(d.tap_spec)
    ps = ragged(prompts)
    plain = RolloutEngine(pol).generate(ps, max_new_tokens=16, greedy=True, stop_tokens=[5])
    for greedy in (True, False):
        kw = {"max_new_tokens": 16, "greedy": greedy, "temperature": 0.8, "seed": 4, "stop_tokens": [5]}
        off = RolloutEngine(pol, proposer(d)).generate(ps, **kw)
        static = RolloutEngine(pol, proposer(d), cuda_graphs="draft").generate(ps, **kw)
        assert static.tokens == off.tokens
        assert static.counters.as_dict() == off.counters.as_dict()
        for a, b in zip(static.logprobs, off.logprobs):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=1e-6)
        if greedy:
            assert static.tokens == plain.tokens                # still lossless
            assert static.counters.accepted > 0                # and proposals were accepted


@pytest.mark.timeout(60)
@pytest.mark.parametrize("k", [1, 2])
def test_static_path_other_chain_lengths(trained, k):
    """k = 1: no chain step between two observes (the RoPE memo must not serve stale positions)."""
    pol, prompts, drafts = trained
    d = drafts["eagle3"]
    pol.set_taps(d.tap_spec)
    ps = ragged(prompts)
    for greedy in (True, False):
        kw = {"max_new_tokens": 12, "greedy": greedy, "temperature": 0.8, "seed": 2}
        off = RolloutEngine(pol, Eagle3Proposer(d, k)).generate(ps, **kw)
        static = RolloutEngine(pol, Eagle3Proposer(d, k), cuda_graphs="draft").generate(ps, **kw)
        assert static.tokens == off.tokens and static.counters.as_dict() == off.counters.as_dict()


@pytest.mark.timeout(60)
def test_one_engine_alternating_request_shapes(trained):
    """Each request shape keeps its static state (buffers, graphs); going back to a shape reuses it."""
    pol, prompts, drafts = trained
    d = drafts["dflash"]
    pol.set_taps(d.tap_spec)
    prop = proposer(d)
    eng, off = RolloutEngine(pol, prop, cuda_graphs="draft"), RolloutEngine(pol, proposer(d))
    for ps in (ragged(prompts), prompts[6:8], ragged(prompts)[::-1], prompts[6:8]):
        kw = {"max_new_tokens": 10, "greedy": False, "seed": 5}
        assert eng.generate(ps, **kw).tokens == off.generate(ps, **kw).tokens
    assert len(prop._states._states) == 2


@pytest.mark.timeout(60)
def test_dspark_confidence_schedule_on_static_caches(trained):
    pol, prompts, drafts = trained
    d = drafts["dspark"]
    pol.set_taps(d.tap_spec)
    ps = ragged(prompts)
    plain = RolloutEngine(pol).generate(ps, max_new_tokens=12, greedy=True)
    d.confidence_threshold = 0.5
    try:
        off = RolloutEngine(pol, proposer(d)).generate(ps, max_new_tokens=12, greedy=True)
        static = RolloutEngine(pol, proposer(d), cuda_graphs="draft").generate(ps, max_new_tokens=12, greedy=True)
    finally:
        d.confidence_threshold = 0.0
    assert static.tokens == off.tokens == plain.tokens
    assert static.counters.as_dict() == off.counters.as_dict()
    c = static.counters
    assert c.draft_tokens < c.verify_steps * c.num_proposals      # chains were cut


def _feed(prop, pol, ps, static):
    """Prefill-observe ``ps`` into ``prop`` (static or growing caches); returns (last token, its position)."""
    B, P = len(ps), max(map(len, ps))
    ids = torch.zeros(B, P, dtype=torch.long)
    for i, p in enumerate(ps):
        ids[i, P - len(p):] = torch.tensor(p)
    plen = torch.tensor([len(p) for p in ps])
    pos = torch.arange(P)[None] - (P - plen)[:, None]
    live = pos >= 0
    with torch.no_grad():
        taps = pol.forward_train(ids).taps
    if static:
        prop.prepare(B, slots_needed(P, 8, prop.num_proposals) + 3, cuda_graphs=False)
    else:
        prop.reset(B)
    nxt = torch.cat([ids[:, 1:], ids[:, -1:]], 1)          # last column: a stand-in first token
    prop.observe(nxt, taps, pos.clamp_min(0), live)
    return nxt[:, -1], plen


@pytest.mark.timeout(60)
@pytest.mark.parametrize("family", FAMILIES)
def test_static_proposals_and_q_equal_the_growing_caches(trained, family):
    pol, prompts, drafts = trained
    d = drafts[family]
    pol.set_taps(d.tap_spec)
    ps = ragged(prompts)
    res = {False: [], True: []}
    for greedy in (True, False):
        for s in (False, True):      # the growing caches, the static ones: the same inputs and generator draws
            prop = proposer(d)
            last, lpos = _feed(prop, pol, ps, s)
            kw = {"greedy": greedy, "temperature": 0.9}
            out = prop.propose(last, lpos, generator=torch.Generator().manual_seed(11), **kw)
            res[s].append(out)
            # a verify step's observe (width k+1, ragged valid columns), finished rows dropped, propose again
            k = prop.num_proposals
            n = torch.tensor([1, 2, 4, 1, 3, 2]).clamp(max=k + 1)
            valid = torch.arange(k + 1)[None] < n[:, None]
            seq = torch.cat([last[:, None], out[0][:, :k]], 1)
            with torch.no_grad():
                taps = [t[:, -(k + 1):] for t in pol.forward_train(torch.cat([seq, seq], 1)).taps]
            prop.observe(seq, taps, lpos[:, None] + torch.arange(k + 1), valid)
            keep = torch.tensor([0, 2, 3, 5])
            prop.select(keep)
            res[s].append(prop.propose(seq.gather(1, (n - 1)[:, None])[keep, 0], (lpos + n)[keep],
                                       generator=torch.Generator().manual_seed(12), **kw))
    for a, b in zip(res[False], res[True]):
        assert torch.equal(a[0], b[0])
        if a[1] is None:
            assert b[1] is None
        else:
            torch.testing.assert_close(a[1], b[1], rtol=0, atol=1e-6)
            torch.testing.assert_close(b[1].sum(-1), torch.ones_like(b[1][..., 0]), rtol=0, atol=1e-5)


@pytest.mark.timeout(30)
def test_noise_sampling_is_exact():
    q = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    n = 40000
    u = torch.rand(n, 5, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(sample_with_noise(q.expand(n, 5), u), minlength=5).float() / n
    torch.testing.assert_close(counts, q, rtol=0, atol=0.01)
    assert counts[4] == 0


@pytest.mark.timeout(30)
def test_graphed_callable_is_eager_on_cpu_and_keys_by_shape(caplog):
    calls = []

    def fn(x, *, scale):
        calls.append(tuple(x.shape))
        return x * scale

    g = GraphedCallable(fn, "t", enabled=True)
    x = torch.ones(2, 3)
    assert torch.equal(g(x, scale=2.0), 2 * x) and calls == [(2, 3)]
    assert g.status() == {"enabled": True, "captures": 0, "replays": 0, "eager_calls": 1, "fallback_reason": None,
                          "graphs": 0, "pools": 0}
    k1 = g.graph_key((x,), {"scale": 2.0})
    assert k1 == g.graph_key((torch.zeros(2, 3),), {"scale": 2.0})
    assert k1 != g.graph_key((torch.ones(3, 3),), {"scale": 2.0})
    assert k1 != g.graph_key((x.double(),), {"scale": 2.0})
    assert k1 != g.graph_key((x,), {"scale": 3.0})
    # a capture that fails (here: no CUDA at all) runs eagerly, says why once, and stays eager
    g.would_capture = lambda inputs: g.fallback_reason is None
    with caplog.at_level(logging.WARNING, logger="repro.decoding.cuda_graph"):
        assert torch.equal(g(x, scale=3.0), 3 * x)
        assert torch.equal(g(x, scale=3.0), 3 * x)
    assert g.fallback_reason and g.captures == 0 and g.eager_calls == 3
    assert sum("capture of t failed" in r.getMessage() for r in caplog.records) == 1
    g.reset()
    assert g.fallback_reason is None
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        GraphedCallable(fn, "t", warmup=0)


@pytest.mark.timeout(30)
def test_shared_pool_graphs_capture_into_one_pool(trained, monkeypatch):
    """A callable with ``shared_pool`` hands every capture the same pool (made once); one without gets none (a pool
    per graph). Every graphed call of the engine shares its own: the prefill (one graph per prompt width), the step
    (one per attention view), the accept (one per sampling setting), the draft's observe and propose (one per view)."""
    handles = []
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: handles.append(object()) or handles[-1])
    g = GraphedCallable(lambda x: x, "g", shared_pool=True)
    assert g.capture_pool() is g.capture_pool() is handles[0] and len(handles) == 1
    assert GraphedCallable(lambda x: x, "h").capture_pool() is None and len(handles) == 1
    pol, prompts, drafts = trained
    pol.set_taps(drafts["eagle3"].tap_spec)
    eng = RolloutEngine(pol, proposer(drafts["eagle3"]), cuda_graphs="all")
    eng.generate(prompts[:2], max_new_tokens=4, greedy=True)
    st = next(iter(eng.static_decoder.states._states.values()))
    assert [st[k].shared_pool for k in ("prefill", "step", "accept")] == [True, True, True]
    assert [eng.proposer._graphs[k].shared_pool for k in ("observe", "propose")] == [True, True]


@pytest.mark.timeout(30)
def test_a_failed_capture_is_tried_once_more(caplog):
    """A capture that fails once and then succeeds replays (one retry, logged); one that always fails runs eagerly."""
    class Graph:
        replays = 0

        def replay(self):
            Graph.replays += 1

    attempts = []

    def capture(inputs, settings, fail=1):
        attempts.append(len(attempts))
        if len(attempts) <= fail:
            raise RuntimeError("operation failed due to a previous error during capture")
        return Graph(), list(inputs), inputs[0] * 2

    x = torch.ones(3)
    g = GraphedCallable(lambda t: t * 2, "t", enabled=True)
    g.would_capture = lambda inputs: g.fallback_reason is None
    g._capture = capture
    with caplog.at_level(logging.WARNING, logger="repro.decoding.cuda_graph"):
        assert torch.equal(g(x), 2 * x) and torch.equal(g(x), 2 * x)
    assert len(attempts) == 2 and g.captures == 1 and Graph.replays == 2 and g.fallback_reason is None
    assert sum("attempt 1 of 2" in r.getMessage() for r in caplog.records) == 1
    attempts.clear()
    h = GraphedCallable(lambda t: t * 2, "h", enabled=True)
    h.would_capture = lambda inputs: h.fallback_reason is None
    h._capture = lambda inputs, settings: capture(inputs, settings, fail=5)
    assert torch.equal(h(x), 2 * x) and len(attempts) == 2 and h.captures == 0 and h.eager_calls == 1
    assert "previous error during capture" in h.fallback_reason


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lagged", (False, True), ids=("exact-flag", "lagged-flag"))
def test_the_smallest_policy_cache_generates_what_a_larger_one_does(trained, family, lagged, monkeypatch):
    """The policy's static cache at the smallest size the request fits (``policy_cache_slots``: the prompt, the
    answer and one verify step, each row writing at its own frontier) gives the tokens, counters and
    log-probabilities of a larger one, and neither compacts; greedy and sampled, ragged rows, stop tokens, under
    replay emulation. ``lagged``: the loop reads its running flag one step late, as on a GPU (a step past the end,
    on rows that have all ended, must stay within the cache)."""
    from repro.rollout.static_loop import RunningFlag

    pol, prompts, drafts = trained
    d = drafts[family]
    pol.set_taps(d.tap_spec)
    monkeypatch.setattr(GraphedCallable, "emulate_replay", True)
    monkeypatch.setattr(RunningFlag, "lag_on_cpu", lagged)
    ps = ragged(prompts)
    runs = [{"max_new_tokens": 24, "greedy": True, "stop_tokens": [5]},
            {"max_new_tokens": 24, "greedy": True},       # every row to the limit, proposals accepted past it
            {"max_new_tokens": 24, "greedy": False, "temperature": 0.8, "seed": 4}]
    full = RolloutEngine(pol, proposer(d), cuda_graphs="all", policy_cache_slots=256)
    want = [full.generate(ps, **kw) for kw in runs]
    small = RolloutEngine(pol, proposer(d), cuda_graphs="all",
                          policy_cache_slots=max(map(len, ps)) + runs[0]["max_new_tokens"] + full.k)
    gots = []
    for kw, w in zip(runs, want):
        got = small.generate(ps, **kw)
        gots.append(got)
        assert got.tokens == w.tokens and got.finish_reason == w.finish_reason
        assert got.counters.as_dict() == w.counters.as_dict()
        # fp32 rounding: attention sums over a view of another width (masked columns)
        torch.testing.assert_close(torch.tensor(sum(got.logprobs, [])), torch.tensor(sum(w.logprobs, [])),
                                   rtol=1e-5, atol=1e-5)
    assert len(small.static_decoder.states._states) == 1
    assert all(g.cache_slots < w.cache_slots for g, w in zip(gots, want))
    assert sum(g.cache_compactions + w.cache_compactions for g, w in zip(gots, want)) == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", ("eagle3", "dspark"))
def test_verify_steps_write_each_rows_frontier(trained, family, monkeypatch):
    """A verify step writes each row's tokens at its own frontier (the token at position p in column p + the row's
    left padding): after a request every row's live slots are exactly its prompt and answer there, with nothing
    live past them, though the rows accepted different numbers of proposals; and in every verify step the mask
    hides each row's columns past its last new one, the promise that lets the attention kernel stop reading there
    (``frontier``)."""
    import repro.models.policy_attention as pa

    pol, prompts, drafts = trained
    d = drafts[family]
    pol.set_taps(d.tap_spec)
    real, checked = pa.grouped_sdpa_write, []

    def promise_checked(q, k_new, v_new, k, v, cols, mask, scale=None, impl="auto", frontier=False):
        if frontier:
            past = torch.arange(mask.shape[-1])[None, :] > cols.max(1).values[:, None]          # [B, S]
            hidden = mask[:, 0] <= torch.finfo(mask.dtype).min / 2                              # [B, q, S]
            assert bool(hidden[past[:, None, :].expand_as(hidden)].all())
            checked.append(cols.clone())
        return real(q, k_new, v_new, k, v, cols, mask, scale, impl, frontier)

    monkeypatch.setattr(pa, "grouped_sdpa_write", promise_checked)
    ps = ragged(prompts)
    eng = RolloutEngine(pol, proposer(d), cuda_graphs="all")
    got = eng.generate(ps, max_new_tokens=20, greedy=False, temperature=0.8, seed=3, stop_tokens=[5])
    assert checked and any(len(set(c[:, 0].tolist())) > 1 for c in checked)     # rows at different frontiers
    P = eng.static_decoder.prompt_columns(max(map(len, ps)))
    (st,) = [s for s in eng.static_decoder.states._states.values()]
    pos = st["cache"].slots.pos
    for b, (p, toks) in enumerate(zip(ps, got.tokens)):
        n = len(p) + len(toks) - 1        # the last token is never fed back: no slot
        pad = P - len(p)
        assert pos[b, pad:pad + n].tolist() == list(range(n)), b
        assert bool((pos[b, :pad] < 0).all()) and bool((pos[b, pad + n:] < 0).all()), b


@pytest.mark.timeout(60)
def test_a_finishing_row_keeps_only_its_kept_tokens_slots(trained):
    """The verify step's accept: a row that continues keeps the slots of its input and accepted proposals; a row
    that reaches its length limit or a stop token keeps only those of the tokens it keeps, so no row's live slots
    pass prompt + answer - 1; and each row's position moves past the tokens it keeps (so the loop's steps past a
    row's end write dead slots beyond its tokens, within the cache ``policy_slots`` sizes)."""
    pol, _, drafts = trained
    pol.set_taps(drafts["eagle3"].tap_spec)
    eng = RolloutEngine(pol, proposer(drafts["eagle3"]), cuda_graphs="all")
    k, max_new = eng.k, 10
    assert k == 3
    st = eng.static_decoder.state(4, 32, False)
    # row 2 proposes the stop token second; the policy agrees with every proposal (all k accepted), then says 9
    drafts_ = torch.tensor([[3, 6, 7], [3, 6, 7], [3, 4, 5], [3, 6, 7]])
    logits = torch.full((4, k + 1, pol.vocab_size), -5.0)
    for j in range(k):
        logits[torch.arange(4), j, drafts_[:, j]] = 5.0
    logits[:, k, 9] = 5.0
    cols = (torch.arange(k + 1) + 20)[None, :].expand(4, -1)     # each row's frontier columns (here the same)
    qpos = (torch.arange(k + 1)[None, :] + 10).expand(4, -1)
    gen_len = torch.tensor([1, max_new - 2, 1, 1])           # row 1: room for 2 more tokens
    active = torch.tensor([True, True, True, False])         # row 3 has finished already
    out = eng.static_decoder.outputs(st, max_new + k + 1)
    stop = torch.tensor([4])
    res = eng.static_decoder._accept_step(st, logits, drafts_, qpos, cols, torch.full((4,), 10),
                                          active, gen_len, *out, torch.tensor(max_new), stop, has_stop=True,
                                          has_probs=False, has_valid=False, greedy=True, temperature=1.0)
    live = (st["cache"].slots.pos[:, cols[0]] >= 0).sum(1).tolist()
    new_len = res[5].tolist()
    assert live == [k + 1, 2, 2, 0]
    assert new_len == [1 + k + 1, max_new, 1 + 2, 1]
    assert res[3].tolist() == [10 + k + 1, 12, 12, 10]      # new positions: past the tokens each row keeps


@pytest.mark.timeout(60)
def test_a_larger_policy_state_serves_and_supersedes_smaller_ones(trained):
    """A request runs on the smallest kept state of its rows with enough columns; a new, larger state drops the
    smaller ones of its rows (their cache and graphs freed), so growing prompts keep one policy cache a batch; the
    drafts' static states follow the same rule."""
    import weakref

    pol, prompts, drafts = trained
    dec = RolloutEngine(pol, cuda_graphs="all").static_decoder
    small = dec.state(2, 256, False)
    freed = weakref.ref(small["cache"])
    assert dec.state(2, 200, False) is small
    del small
    large = dec.state(2, 512, False)
    assert dec.states.keys() == [(2, 512)] and freed() is None
    assert dec.state(2, 256, False) is large and large["cache"].max_slots == 512
    other = dec.state(4, 256, False)
    assert other is not large and dec.states.keys() == [(2, 512), (4, 256)]
    # a request served by larger states (the policy's and the draft's) generates what states of its size do
    ps = ragged(prompts)
    pol.set_taps(drafts["dspark"].tap_spec)
    want = RolloutEngine(pol, proposer(drafts["dspark"]), cuda_graphs="all").generate(ps, max_new_tokens=8,
                                                                                      greedy=True)
    prop = proposer(drafts["dspark"])
    eng = RolloutEngine(pol, prop, cuda_graphs="all")
    rows = eng.static_rows(len(ps))
    eng.static_decoder.state(rows, 1024, False)
    prop.prepare(rows, 2048, cuda_graphs=False)
    got = eng.generate(ps, max_new_tokens=8, greedy=True)
    assert got.tokens == want.tokens and got.counters.as_dict() == want.counters.as_dict()
    assert got.cache_slots == 1024 and want.cache_slots < 1024
    assert [k[:2] for k in prop._states.keys()] == [(rows, 2048)] and prop.slots.max_slots == 2048


@pytest.mark.timeout(120)
def test_engines_sharing_kv_storage_generate_what_they_do_alone(trained):
    """Two engines of different policies (same shapes) whose static policy caches are views of one
    ``SharedKVStorage``, requests alternating between them (two batch sizes, so each engine also holds two states on
    the same buffers), greedy and sampled: every result equals the same engine's alone, exactly."""
    from repro.decoding.policy_cache import SharedKVStorage

    pol, prompts, drafts = trained
    other = build_policy("qwen3", "tiny", seed=9, init_std=0.3)
    d = drafts["dflash"]
    for p in (pol, other):
        p.set_taps(d.tap_spec)
    storage = SharedKVStorage()
    shared = [RolloutEngine(p, proposer(d), cuda_graphs="all", kv_storage=storage) for p in (pol, other)]
    alone = [RolloutEngine(p, proposer(d), cuda_graphs="all") for p in (pol, other)]
    requests = [(ragged(prompts), {"greedy": True}), (prompts[6:8], {"greedy": False, "seed": 3}),
                (ragged(prompts)[::-1], {"greedy": False, "seed": 4, "stop_tokens": [5]})]
    for ps, kw in requests:
        for eng_shared, eng_alone in zip(shared, alone):
            got = eng_shared.generate(ps, max_new_tokens=12, **kw)
            want = eng_alone.generate(ps, max_new_tokens=12, **kw)
            assert got.tokens == want.tokens and got.logprobs == want.logprobs
            assert got.counters.as_dict() == want.counters.as_dict()
    caches = [st["cache"] for eng in shared for st in eng.static_decoder.states._states.values()]
    assert len(caches) == 4
    assert len({c.keys.untyped_storage().data_ptr() for c in caches}) == 1       # one buffer under all four
    assert storage.nbytes() == max(c.keys.nbytes + c.values.nbytes for c in caches)


def test_shared_kv_storage_views_and_grows():
    from repro.decoding.policy_cache import SharedKVStorage

    storage = SharedKVStorage()
    a = storage.take("keys", (2, 3), torch.float32, "cpu")
    b = storage.take("keys", (3, 2), torch.float32, "cpu")
    assert a.data_ptr() == b.data_ptr() and tuple(b.shape) == (3, 2)
    assert a.is_contiguous() and not a._is_view() and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    b[2, 1] = 7.0
    assert float(a[1, 2]) == 7.0                                     # the same memory
    assert storage.take("values", (2, 3), torch.float32, "cpu").data_ptr() != a.data_ptr()
    assert storage.take("keys", (2, 3), torch.bfloat16, "cpu").data_ptr() != a.data_ptr()
    a.fill_(1.0)
    c = storage.take("keys", (4, 4), torch.float32, "cpu")          # larger: a new buffer, the old one kept by a
    assert c.data_ptr() != a.data_ptr() and float(c.sum()) == 0.0 and float(a.sum()) == 6.0
    assert tuple(c.stride()) == (4, 1)
    assert storage.nbytes() == 16 * 4 + 6 * 4 + 6 * 2


@pytest.mark.timeout(120)
def test_self_check_runs_each_family_on_the_smallest_cache(trained):
    """The engine self-check (the decode benchmark's first step on a GPU) adds, per family, the last static mode on
    the smallest policy cache the request fits: identical greedy tokens, and no compaction needed."""
    from repro.rollout.self_check import run_self_check, verdict_table

    pol, prompts, drafts = trained
    report = run_self_check(pol, {f: drafts[f] for f in ("eagle3", "dspark")}, lambda fam, d: proposer(d),
                            ragged(prompts), new_tokens=16, stop_token=5, timing_batches=(), modes=("off", "all"),
                            progress=lambda line: None)
    assert report["passed"], report["failures"]
    assert set(report["compactions"]) == {"eagle3/all+smallest", "dspark/all+smallest"}
    assert all(n == 0 for n in report["compactions"].values())
    assert report["identity"]["dspark/all+smallest"] == 1.0
    assert "dspark/all+smallest" in verdict_table(report)


@pytest.mark.timeout(30)
def test_policy_cache_slots_are_checked(trained):
    pol, prompts, drafts = trained
    pol.set_taps(drafts["eagle3"].tap_spec)
    with pytest.raises(ValueError, match="policy_cache_slots must be an int >= 1 or None, got 0"):
        RolloutEngine(pol, proposer(drafts["eagle3"]), cuda_graphs="all", policy_cache_slots=0)
    with pytest.raises(ValueError, match="needs a cuda_graphs mode with the policy on a static cache"):
        RolloutEngine(pol, proposer(drafts["eagle3"]), cuda_graphs="draft", policy_cache_slots=64)
    eng = RolloutEngine(pol, proposer(drafts["eagle3"]), cuda_graphs="all", policy_cache_slots=20)
    with pytest.raises(ValueError, match=r"policy_cache_slots=20 is too small for the request: it needs at least 23 "
                                         r"\(longest prompt 4 \+ max_new_tokens 16 \+ k 3\)"):
        eng.generate(prompts[:2], max_new_tokens=16, greedy=True)


@pytest.mark.timeout(30)
def test_a_capture_out_of_memory_releases_cached_memory_before_the_retry(monkeypatch):
    """A capture's private pool cannot use the ordinary pool's cached free blocks: after an out-of-memory capture
    the cache is emptied before the retry (and only then)."""
    events = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))

    class Graph:
        def replay(self):
            pass

    def capture(inputs, settings, error):
        events.append("capture")
        if events.count("capture") == 1:
            raise error
        return Graph(), list(inputs), inputs[0]

    for error, want in ((torch.OutOfMemoryError("CUDA out of memory"), ["capture", "empty_cache", "capture"]),
                        (RuntimeError("capture invalidated"), ["capture", "capture"])):
        events.clear()
        g = GraphedCallable(lambda t: t, "t", enabled=True)
        g.would_capture = lambda inputs: g.fallback_reason is None
        g._capture = lambda inputs, settings, error=error: capture(inputs, settings, error)
        g(torch.ones(3))
        assert events == want and g.captures == 1


@pytest.mark.timeout(30)
def test_a_retried_capture_takes_a_fresh_shared_pool(monkeypatch):
    """A broken capture can leave the allocator recording into its pool; the retry of a ``shared_pool`` callable
    captures into a new pool, which later captures share."""
    handles = []
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: handles.append(object()) or handles[-1])
    pools = []

    class Graph:
        def replay(self):
            pass

    def capture(inputs, settings):
        pools.append(g.capture_pool())
        if len(pools) == 1:
            raise RuntimeError("operation failed due to a previous error during capture")
        return Graph(), list(inputs), inputs[0]

    g = GraphedCallable(lambda t: t, "t", enabled=True, shared_pool=True)
    g.would_capture = lambda inputs: g.fallback_reason is None
    g._capture = capture
    g(torch.ones(3))
    g(torch.ones(4))
    assert pools == [handles[0], handles[1], handles[1]] and g.captures == 2


@pytest.mark.timeout(30)
def test_shared_graph_pools_give_callables_of_one_key_one_pool(monkeypatch):
    """Inside ``shared_graph_pools()`` the ``shared_pool`` callables made take their pool by key from one registry
    (made once a key), for their whole life; outside, each has its own; a callable without ``shared_pool`` has none. A
    broken capture drops the key's pool, so the next capture of any member takes a fresh one."""
    handles = []
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: handles.append(object()) or handles[-1])
    with shared_graph_pools() as pools:
        a, b = (GraphedCallable(lambda x: x, "policy.step", shared_pool=True) for _ in range(2))
        c = GraphedCallable(lambda x: x, "DFlashDraft.train_step", shared_pool=True, pool_key="draft.train_step")
        d = GraphedCallable(lambda x: x, "EAGLE3Draft.train_step", shared_pool=True, pool_key="draft.train_step")
        own = GraphedCallable(lambda x: x, "policy.step")
    alone = GraphedCallable(lambda x: x, "policy.step", shared_pool=True)
    assert a.capture_pool() is b.capture_pool() is handles[0]
    assert c.capture_pool() is d.capture_pool() is handles[1] and own.capture_pool() is None
    assert alone.capture_pool() is handles[2] and len(handles) == 3
    assert set(pools.members("policy.step")) == {a, b} and sorted(pools.keys()) == ["draft.train_step", "policy.step"]
    assert set(a.pool_peers()) == {a, b} and alone.pool_peers() == [alone] and own.pool_peers() == []

    def broken(inputs, settings):
        a.capture_pool()
        raise RuntimeError("operation failed due to a previous error during capture")

    a.would_capture = lambda inputs: True
    a._capture = broken
    with caplog_off():
        a(torch.ones(2))                                  # both attempts fail: it runs eagerly
    assert a.fallback_reason and b.capture_pool() is handles[0]       # b captured into it already: keeps it
    b._pool = None                                        # b's next capture: a fresh pool, the key's from then on
    fresh = b.capture_pool()
    assert fresh is handles[-1] and fresh is not handles[0] and pools.handle("policy.step") is fresh


def test_graph_pools_count_their_segments(monkeypatch):
    """``segment_bytes`` sums a memory snapshot's segments by the key whose pool they belong to (the ordinary pool's
    and other pools' left out; a key whose pool holds none: 0); ``active_graph_pools`` is the innermost open one."""
    handles = iter([(1, 0), (2, 0)])
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: next(handles))
    assert active_graph_pools() is None
    with shared_graph_pools() as pools:
        assert active_graph_pools() is pools
        pools.handle("policy.step"), pools.handle("block.propose")
        with shared_graph_pools() as inner:
            assert active_graph_pools() is inner
        assert active_graph_pools() is pools
    segments = [{"segment_pool_id": (0, 0), "total_size": 7}, {"segment_pool_id": (1, 0), "total_size": 2},
                {"segment_pool_id": (1, 0), "total_size": 3}, {"segment_pool_id": (9, 0), "total_size": 5}]
    assert pools.segment_bytes(segments) == {"policy.step": 5, "block.propose": 0}
    assert graph_pool_bytes(segments) == 10                # every graph pool's, the ordinary pool's left out


@contextlib.contextmanager
def caplog_off():
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.timeout(30)
def test_replay_emulation_poisons_the_fresh_outputs_of_a_pools_other_graphs(monkeypatch):
    """Under ``emulate_replay`` a call overwrites what the other graphs of its pool returned (as its replay may on a
    GPU), the call's own graph included only for its other keys; outputs ``fn`` hands back from elsewhere (an input,
    a persistent buffer) are not the pool's and stay."""
    monkeypatch.setattr(GraphedCallable, "emulate_replay", True)
    persistent = torch.arange(3.0)
    with shared_graph_pools():
        f = GraphedCallable(lambda x: (x * 2, persistent, x), "f", shared_pool=True, persistent_inputs=True)
        g = GraphedCallable(lambda x: (x + 1).long(), "f", shared_pool=True)
    other = GraphedCallable(lambda x: x - 1, "other", shared_pool=True)
    x = torch.ones(3)
    doubled, kept, same = f(x)
    assert doubled.tolist() == [2.0] * 3 and kept is persistent and same is x
    assert f(x)[0] is doubled and doubled.tolist() == [2.0] * 3            # its own key: replayed, not poisoned
    other(torch.ones(3))                                                   # another pool: nothing poisoned
    assert doubled.tolist() == [2.0] * 3
    ints = g(x)
    assert torch.isnan(doubled).all() and persistent.tolist() == [0.0, 1.0, 2.0] and x.tolist() == [1.0] * 3
    f(torch.ones(3))
    assert (ints == torch.iinfo(torch.long).min).all() and doubled.tolist() == [2.0] * 3
    wide = f(torch.ones(4))[0]                                             # the same callable's other key
    assert torch.isnan(doubled).all() and wide.tolist() == [2.0] * 4


@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", ("plain", *FAMILIES))
def test_engines_sharing_graph_pools_generate_what_they_do_alone(trained, family, monkeypatch):
    """Two engines of different policies (same shapes), built inside ``shared_graph_pools()`` on one
    ``SharedKVStorage`` as a lockstep's rows are, under replay emulation (every call poisoning the outputs of the
    other graphs of its pool, both engines' and both request shapes'), requests alternating between them: every
    result equals the same engine's alone. An output read after another graph of its pool replayed would not."""
    from repro.decoding.policy_cache import SharedKVStorage

    pol, prompts, drafts = trained
    other = build_policy("qwen3", "tiny", seed=9, init_std=0.3)
    make = (lambda: None) if family == "plain" else (lambda: proposer(drafts[family]))
    if family != "plain":
        for p in (pol, other):
            p.set_taps(drafts[family].tap_spec)
    alone = [RolloutEngine(p, make(), cuda_graphs="all") for p in (pol, other)]
    requests = [(ragged(prompts), {"greedy": True}), (prompts[6:8], {"greedy": False, "seed": 3}),
                (ragged(prompts)[::-1], {"greedy": False, "seed": 4, "stop_tokens": [5]})]
    want = [[eng.generate(ps, max_new_tokens=12, **kw) for eng in alone] for ps, kw in requests]
    monkeypatch.setattr(GraphedCallable, "emulate_replay", True)
    storage = SharedKVStorage()
    with shared_graph_pools() as pools:                  # the engines' graphed calls are made per request shape
        shared = [RolloutEngine(p, make(), cuda_graphs="all", kv_storage=storage) for p in (pol, other)]
        for (ps, kw), w in zip(requests, want):
            for eng, w_eng in zip(shared, w):
                assert_same_rollout(eng.generate(ps, max_new_tokens=12, **kw), w_eng)
    members = pools.members("policy.step")
    assert len(members) == 4                          # two engines, two request shapes each: one pool
    assert sum(len(m._fresh_outputs[k]) > 0 for m in members for k in m._fresh_outputs) >= 4     # poisoned ones


@pytest.mark.timeout(30)
def test_capture_runs_without_the_cyclic_collector(monkeypatch):
    """No garbage collection inside a capture (it could destroy another graph, which breaks the capture); the
    collector's state is restored afterwards, also when the captured work raises."""
    import gc

    from repro.decoding import cuda_graph

    monkeypatch.setattr(cuda_graph.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(cuda_graph.torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(cuda_graph, "capture_stream", lambda: None)
    seen = []

    class Graph:
        def capture_begin(self, pool=None):
            seen.append(("begin", gc.isenabled()))

        def capture_end(self):
            seen.append(("end", gc.isenabled()))

    assert gc.isenabled()
    with cuda_graph.capture_into(Graph()):
        seen.append(("body", gc.isenabled()))
    assert seen == [("begin", False), ("body", False), ("end", False)] and gc.isenabled()
    with pytest.raises(RuntimeError, match="broken"), cuda_graph.capture_into(Graph()):
        raise RuntimeError("broken")
    assert gc.isenabled()
    gc.disable()
    try:
        with cuda_graph.capture_into(Graph()):
            pass
        assert not gc.isenabled()          # a caller that had it off keeps it off
    finally:
        gc.enable()


@pytest.mark.timeout(30)
def test_bad_values_fail_clearly(trained):
    pol, prompts, drafts = trained
    d = drafts["eagle3"]
    pol.set_taps(d.tap_spec)
    with pytest.raises(ValueError,
                       match=r"cuda_graphs='full' is invalid: expected one of \('off', 'draft', 'all', 'whole_drafts', "
                             r"'compiled', 'compiled_drafts', 'fused'\)"):
        RolloutEngine(pol, proposer(d), cuda_graphs="full")
    with pytest.raises(ValueError, match="OracleProposer has none"):
        RolloutEngine(pol, OracleProposer(pol, 2, prompts[:1]), cuda_graphs="draft")
    with pytest.raises(ValueError, match="max_draft_slots must be >= 1"):
        RolloutEngine(pol, proposer(d), cuda_graphs="draft", max_draft_slots=0)
    eng = RolloutEngine(pol, proposer(d), cuda_graphs="draft", max_draft_slots=40)
    before = pol.model.training
    with pytest.raises(ValueError, match=r"needs 61 draft cache slots per row .* over max_draft_slots=40"):
        eng.generate([[1, 2, 3, 4, 5]], max_new_tokens=15, greedy=True)      # 5 + 14 x 4
    assert pol.model.training == before
    assert len(eng.generate([[1, 2, 3, 4, 5]], max_new_tokens=9, greedy=True).tokens[0]) == 9   # 37 fit
    cur = Cursor(8, "cpu")
    cur.set(4, 4)
    with pytest.raises(RuntimeError, match="draft cache overflow: a write of 4 slots at column 5 passes max_slots=8"):
        cur.set(5, 4)
    with pytest.raises(ValueError, match="max_slots must be >= 1"):
        StaticSlots(2, 0, "cpu")
    assert CUDA_GRAPH_MODES == ("off", "draft", "all", "whole_drafts", "compiled", "compiled_drafts", "fused")


def test_rl_config_switch():
    from repro.core.specs import CUDA_GRAPH_MODES as CFG_MODES
    from repro.core.specs import ConfigError
    from repro.rl.config import load_run_profile, run_config_from_profile
    assert CFG_MODES == CUDA_GRAPH_MODES
    h200 = run_config_from_profile(load_run_profile("h200"), "table1", "Qwen3-8B/EAGLE-3", out="o")
    tiny = run_config_from_profile(load_run_profile("cpu-tiny"), "table1", "Qwen3-8B/EAGLE-3", out="o")
    assert h200.cuda_graphs == "compiled_drafts" and h200.to_dict()["cuda_graphs"] == "compiled_drafts"
    assert tiny.cuda_graphs == "off" and "cuda_graphs" not in tiny.to_dict()
    tiny.cuda_graphs = "all"
    assert tiny.validate().to_dict()["cuda_graphs"] == "all"
    tiny.cuda_graphs = "full"
    with pytest.raises(ConfigError, match=r"cuda_graphs='full' is invalid"):
        tiny.validate()
    prof = load_run_profile("cpu-tiny")
    prof["rl"]["rollout"] = {"cuda_graph": "draft"}
    with pytest.raises(ConfigError, match=r"rl.rollout.cuda_graph: unknown key 'cuda_graph'; "
                                          r"expected one of bucket_batch, cuda_graphs"):
        run_config_from_profile(prof, "table1", "Qwen3-8B/EAGLE-3", out="o")
    # bucket_batch: off unless asked (and then left out of the config, as before it existed); needs cuda_graphs draft
    assert h200.bucket_batch is False and "bucket_batch" not in h200.to_dict()
    prof = load_run_profile("h200")
    prof["fig4"]["rollout"] = {"bucket_batch": True}
    fig4 = run_config_from_profile(prof, "fig4", "DSpark", out="o")
    assert fig4.bucket_batch and fig4.cuda_graphs == "compiled_drafts" and fig4.to_dict()["bucket_batch"] is True
    prof = load_run_profile("cpu-tiny")
    prof["rl"]["rollout"] = {"bucket_batch": True}
    with pytest.raises(ConfigError, match=r"bucket_batch=True is invalid: expected false, or true with rl.rollout"):
        run_config_from_profile(prof, "table1", "Qwen3-8B/EAGLE-3", out="o")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("family", FAMILIES)
def test_bucketed_batch_generates_what_the_exact_batch_does(trained, family):
    """bucket_batch: a request of 6 rows runs in a static batch of 8 (2 rows idle from the start), then shrinking
    multi-turn-like requests of 5, 3 and 6 rows reuse the bucketed states; tokens, counters and log-probabilities equal
    the exact-batch static path's and the growing caches'."""
    from repro.decoding.static_kv import batch_bucket

    pol, prompts, drafts = trained
    d = drafts[family]
    pol.set_taps(d.tap_spec)
    ps = ragged(prompts)
    exact = RolloutEngine(pol, proposer(d), cuda_graphs="draft")
    bucketed = RolloutEngine(pol, proposer(d), cuda_graphs="draft", bucket_batch=True)
    off = RolloutEngine(pol, proposer(d))
    for turn, rows in enumerate((ps, ps[:5], ps[1:4], ps)):
        for greedy in (True, False):
            kw = {"max_new_tokens": 12, "greedy": greedy, "temperature": 0.8, "seed": 7 + turn, "stop_tokens": [5]}
            a, b, c = (e.generate(rows, **kw) for e in (exact, bucketed, off))
            assert b.tokens == a.tokens == c.tokens, (turn, greedy)
            assert b.counters.as_dict() == a.counters.as_dict()
            for x, y in zip(b.logprobs, a.logprobs):
                torch.testing.assert_close(torch.tensor(x), torch.tensor(y), rtol=0, atol=1e-6)
    keys = list(bucketed.proposer._states._states)
    assert sorted({k[0] for k in keys}) == sorted({batch_bucket(n) for n in (6, 5, 3)}) == [4, 8]
    assert bucketed.proposer._states.size == 16


def test_bucket_batch_is_checked(trained):
    from repro.decoding.static_kv import batch_bucket

    pol, prompts, drafts = trained
    d = drafts["dflash"]
    pol.set_taps(d.tap_spec)
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 30, 64, 65)] == [2, 2, 4, 4, 8, 8, 16, 32, 64, 128]
    with pytest.raises(ValueError, match="batch must be >= 1, got 0"):
        batch_bucket(0)
    with pytest.raises(ValueError, match="bucket_batch=True needs a cuda_graphs mode other than 'off'"):
        RolloutEngine(pol, proposer(d), bucket_batch=True)
    with pytest.raises(ValueError, match="bucket_batch=True needs a proposer with static states"):
        RolloutEngine(pol, OracleProposer(pol, 2, prompts[:1]), cuda_graphs="draft", bucket_batch=True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", ("plain", *FAMILIES))
def test_min_static_rows_runs_small_requests_on_the_larger_state(trained, family):
    """min_static_rows=8: requests of 6 and 3 rows run on the policy's (and the proposer's) static state of 8 rows,
    the rows past the request idle; greedy tokens and counters equal the exact batch's, log-probabilities to fp32
    rounding, and no state of another row count is built."""
    pol, prompts, drafts = trained
    prop = (lambda: None) if family == "plain" else (lambda: proposer(drafts[family]))
    if family != "plain":
        pol.set_taps(drafts[family].tap_spec)
    ps = ragged(prompts)
    exact = RolloutEngine(pol, prop(), cuda_graphs="all")
    padded = RolloutEngine(pol, prop(), cuda_graphs="all", min_static_rows=8)
    assert [padded.static_rows(n) for n in (3, 6, 8, 9)] == [8, 8, 8, 9]
    for rows in (ps, ps[1:4]):
        kw = {"max_new_tokens": 12, "greedy": True, "stop_tokens": [5]}
        a, b = exact.generate(rows, **kw), padded.generate(rows, **kw)
        assert b.tokens == a.tokens and b.finish_reason == a.finish_reason
        assert b.counters.as_dict() == a.counters.as_dict()
        for x, y in zip(b.logprobs, a.logprobs):    # fp32 products over 8 rows round apart from those over 6 or 3
            torch.testing.assert_close(torch.tensor(x), torch.tensor(y), rtol=0, atol=1e-4)
    assert {k[0] for k in padded.static_decoder.states._states} == {8}
    if family != "plain":
        assert {k[0] for k in padded.proposer._states._states} == {8}


def test_min_static_rows_is_checked(trained):
    pol, _, drafts = trained
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=rf"min_static_rows must be an int >= 1 or None, got {bad!r}"):
            RolloutEngine(pol, cuda_graphs="all", min_static_rows=bad)
    with pytest.raises(ValueError, match=r"min_static_rows=4 needs a cuda_graphs mode other than 'off'"):
        RolloutEngine(pol, min_static_rows=4)
    assert RolloutEngine(pol, cuda_graphs="all").static_rows(3) == 3


# -- cuda_graphs="all": the policy on its static cache too, decisions on the device (eager on CPU) -------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", ("plain", *FAMILIES))
@pytest.mark.parametrize("bucket", [False, True])
def test_all_static_greedy_is_plain_greedy(trained, family, bucket):
    """Ragged prompts, a stop token that ends some rows early, idle bucket rows: every row's tokens, stop
    reasons and log-probabilities as on the dynamic caches, and the same acceptance counters."""
    pol, prompts, drafts = trained
    if family != "plain":
        pol.set_taps(drafts[family].tap_spec)
    prop = (lambda: None) if family == "plain" else (lambda: proposer(drafts[family]))
    ps = ragged(prompts)
    plain = RolloutEngine(pol).generate(ps, max_new_tokens=16, greedy=True)
    stop = plain.tokens[1][5]                                # row 1 (at least) stops early
    kw = {"max_new_tokens": 16, "greedy": True, "stop_tokens": [stop]}
    ref = RolloutEngine(pol).generate(ps, **kw)
    assert "stop" in ref.finish_reason and "length" in ref.finish_reason
    off = RolloutEngine(pol, prop()).generate(ps, **kw)
    eng = RolloutEngine(pol, prop(), cuda_graphs="all", bucket_batch=bucket)
    for _ in range(2):                                       # the second call reuses the static state
        got = eng.generate(ps, **kw)
        assert got.tokens == ref.tokens
        assert got.finish_reason == ref.finish_reason
        assert got.counters.as_dict() == off.counters.as_dict()
        assert got.policy_forwards == off.policy_forwards
        for a, b in zip(got.logprobs, off.logprobs):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=1e-5)
    if family != "plain":
        assert got.counters.accepted > 0                     # the drafts' proposals were verified and kept
    assert got.cache_slots == 256 and got.cache_compactions == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", ("plain", "dflash"))
def test_lagged_running_flag_changes_no_output(trained, family, monkeypatch):
    """The GPU's loop reads the running flag one step late: the same tokens, reasons, log-probabilities and
    counters, and exactly one policy forward more (a step on rows that have all finished)."""
    from repro.rollout.static_loop import RunningFlag

    pol, prompts, drafts = trained
    if family != "plain":
        pol.set_taps(drafts[family].tap_spec)
    ps = ragged(prompts)
    plain = RolloutEngine(pol).generate(ps, max_new_tokens=16, greedy=True)
    kw = {"max_new_tokens": 16, "greedy": True, "stop_tokens": sorted({t[6] for t in plain.tokens})}
    prop = (lambda: None) if family == "plain" else (lambda: proposer(drafts[family]))
    exact = RolloutEngine(pol, prop(), cuda_graphs="all").generate(ps, **kw)
    monkeypatch.setattr(RunningFlag, "lag_on_cpu", True)
    lagged = RolloutEngine(pol, prop(), cuda_graphs="all").generate(ps, **kw)
    assert lagged.tokens == exact.tokens and lagged.finish_reason == exact.finish_reason
    assert lagged.logprobs == exact.logprobs
    assert lagged.counters.as_dict() == exact.counters.as_dict()
    assert lagged.policy_forwards == exact.policy_forwards + 1   # one step past the end, and no more
    assert exact.policy_forwards < 16 and set(exact.finish_reason) == {"stop"}   # the lag had a step to cost


@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", ("plain", "dflash"))
def test_compiled_static_step_is_the_static_step(trained, family, monkeypatch):
    """cuda_graphs="compiled": the policy's decoder layers through torch.compile (dynamo with its eager backend
    here: the same graph capture inductor compiles on a GPU, without the C++ build) under replay emulation give
    the tokens, log-probabilities and counters of the uncompiled static path, over requests of two batch sizes;
    one compiled forward serves every layer (the layer index is a graph input, not a guard), new shapes do not
    recompile it per shape, and outside the step the layers are the model's own."""
    from repro.rollout.compiled_layers import compiled_forward, compiled_layers
    pol, prompts, drafts = trained
    if family != "plain":
        pol.set_taps(drafts[family].tap_spec)
    make = (lambda: None) if family == "plain" else (lambda: proposer(drafts[family]))
    ps = ragged(prompts)
    requests = [(ps, True, 0), (ps[:3], False, 1)]
    monkeypatch.setattr(GraphedCallable, "emulate_replay", True)
    static = RolloutEngine(pol, make(), cuda_graphs="all")
    want = [static.generate(p, max_new_tokens=10, greedy=g, temperature=0.9, seed=s) for p, g, s in requests]
    torch._dynamo.reset()
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    eng = RolloutEngine(pol, make(), cuda_graphs="compiled", compile_backend="eager")
    layer_cls = type(pol.decoder_layers()[0])
    for (p, g, s), w in zip(requests, want):
        got = eng.generate(p, max_new_tokens=10, greedy=g, temperature=0.9, seed=s)
        assert_same_rollout(got, w)
        assert all("forward" not in vars(layer) for layer in pol.decoder_layers())
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames
    # two graphs per compilation: the attention, which writes the static cache, runs eagerly between them; the
    # prefill (a shared cursor, the prompt's columns) is one more compilation
    assert pol.num_layers == 8 and 2 <= graphs <= 8, (
        f"{graphs} dynamo graphs for {pol.num_layers} layers: the layers did not share one compilation, or it "
        "recompiled per shape")
    with compiled_layers(pol, "eager"):
        assert pol.decoder_layers()[3].forward.func is compiled_forward(layer_cls, "eager")
        with pytest.raises(RuntimeError, match="already has its own forward"), compiled_layers(pol, "eager"):
            pass
    with compiled_layers(pol, None):                 # no backend: the layers stay their own
        assert all("forward" not in vars(layer) for layer in pol.decoder_layers())


@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", ("plain", "eagle3", "dspark"))
def test_fused_step_is_the_static_step(trained, family, monkeypatch):
    """cuda_graphs="fused": the prefill with the first token, and each step (the policy's verify, the acceptance,
    the draft's observe and next propose), traced whole (``fullgraph``: a graph break fails here) by dynamo with its
    eager backend, under replay emulation, prompts left-padded to the prompt bucket: the tokens, log-probabilities
    and counters of the untraced static path, over two batch sizes, greedy and sampled."""
    pol, prompts, drafts = trained
    if family != "plain":
        pol.set_taps(drafts[family].tap_spec)
    make = (lambda: None) if family == "plain" else (lambda: proposer(drafts[family]))
    ps = ragged(prompts)
    requests = [(ps, True, 0), (ps[:3], False, 1), (ps[:1], False, 2)]
    monkeypatch.setattr(GraphedCallable, "emulate_replay", True)
    static = RolloutEngine(pol, make(), cuda_graphs="all")
    want = [static.generate(p, max_new_tokens=10, greedy=g, temperature=0.9, seed=s) for p, g, s in requests]
    torch._dynamo.reset()
    eng = RolloutEngine(pol, make(), cuda_graphs="fused", compile_backend="eager")
    for (p, g, s), w in zip(requests, want):
        got = eng.generate(p, max_new_tokens=10, greedy=g, temperature=0.9, seed=s)
        assert_same_rollout(got, w)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0      # it was traced, not run as it is
    status = eng.graph_status()
    assert set(status) >= {f"policy.fused_step[{len(ps)}x256]"}
    if family != "plain":         # the draft's observe and propose ran inside the traced prefill and steps
        assert not any(status[part]["captures"] + status[part]["replays"] + status[part]["eager_calls"]
                       for part in ("propose", "observe"))


@pytest.mark.timeout(240)
def test_fused_prompt_padding_never_passes_the_slot_cap(trained):
    """A fused request sized exactly to max_draft_slots (its steps and the last step's proposals, which the fused
    graph writes too: an EAGLE-3 chain's keys) runs unpadded, as left padding to the prompt bucket would pass the
    cap, and gives the static path's tokens."""
    from repro.decoding.static_kv import slots_needed
    pol, _, drafts = trained
    pol.set_taps(drafts["eagle3"].tap_spec)
    prompt, n = [[3, 1, 4]], 5
    eng = RolloutEngine(pol, proposer(drafts["eagle3"]), cuda_graphs="fused", compile_backend="eager")
    cap = slots_needed(len(prompt[0]), n, eng.k) + eng.k - 1        # + the last step's chain keys
    assert eng.slots_for(len(prompt[0]), n) == cap
    assert eng.slots_for(eng.static_decoder.prompt_columns(len(prompt[0])), n) > cap
    eng.max_draft_slots = cap
    want = RolloutEngine(pol, proposer(drafts["eagle3"]), cuda_graphs="all").generate(prompt, max_new_tokens=n,
                                                                                     greedy=True)
    assert eng.generate(prompt, max_new_tokens=n, greedy=True).tokens == want.tokens


@pytest.mark.timeout(240)
def test_fused_step_after_an_eager_prefill_is_the_static_step(trained, monkeypatch):
    """The fused mode as a GPU runs it: the prefill eager (no prompt padding), the draft's first proposals from its
    own propose, then the traced whole steps: the tokens, log-probabilities and counters of the static path."""
    pol, prompts, drafts = trained
    pol.set_taps(drafts["dspark"].tap_spec)
    ps = ragged(prompts)
    requests = [(ps, True, 0), (ps[:3], False, 1)]
    monkeypatch.setattr(GraphedCallable, "emulate_replay", True)
    static = RolloutEngine(pol, proposer(drafts["dspark"]), cuda_graphs="all")
    want = [static.generate(p, max_new_tokens=10, greedy=g, temperature=0.9, seed=s) for p, g, s in requests]
    torch._dynamo.reset()
    eng = RolloutEngine(pol, proposer(drafts["dspark"]), cuda_graphs="fused", compile_backend="eager")
    eng.static_decoder.prefill, eng.static_decoder.prompt_bucket = None, 1
    for (p, g, s), w in zip(requests, want):          # two batch sizes: two states, each with its draft's graphs
        assert_same_rollout(eng.generate(p, max_new_tokens=10, greedy=g, temperature=0.9, seed=s), w)
        status = eng.graph_status()
        calls = {part: sum(status[part][n] for n in ("captures", "replays", "eager_calls"))
                 for part in ("propose", "observe")}
        assert calls == {"propose": 1, "observe": 0}     # the request's first proposals; every observe inline


@pytest.mark.timeout(240)
@pytest.mark.parametrize("family,mode", [("eagle3", "compiled_drafts"), ("dflash", "compiled_drafts"),
                                         ("dspark", "whole_drafts")])
def test_compiled_drafts_step_is_the_static_step(trained, family, mode, monkeypatch):
    """cuda_graphs="compiled_drafts": the policy's decoder layers compiled one at a time (as "compiled") and the
    draft's propose and observe each traced whole; "whole_drafts": the same drafts, the policy's step uncompiled
    (as "all"). Dynamo's eager backend here, under replay emulation: the tokens, log-probabilities and counters of
    the untraced static path, greedy and sampled."""
    from repro.rollout import compiled_layers as cl
    pol, prompts, drafts = trained
    pol.set_taps(drafts[family].tap_spec)
    ps = ragged(prompts)
    requests = [(ps, True, 0), (ps[:3], False, 1)]
    monkeypatch.setattr(GraphedCallable, "emulate_replay", True)
    static = RolloutEngine(pol, proposer(drafts[family]), cuda_graphs="all")
    want = [static.generate(p, max_new_tokens=10, greedy=g, temperature=0.9, seed=s) for p, g, s in requests]
    torch._dynamo.reset()
    monkeypatch.setattr(cl, "_COMPILED", {})
    eng = RolloutEngine(pol, proposer(drafts[family]), cuda_graphs=mode, compile_backend="eager")
    assert eng.proposer.compile_static == "eager" and eng.static_decoder.fused is None
    for (p, g, s), w in zip(requests, want):
        got = eng.generate(p, max_new_tokens=10, greedy=g, temperature=0.9, seed=s)
        assert_same_rollout(got, w)
    layers_compiled = (type(pol.decoder_layers()[0]), "eager", "decode") in cl._COMPILED   # one at a time
    assert layers_compiled == (mode == "compiled_drafts")
    assert eng.static_decoder.compile_backend == ("eager" if mode == "compiled_drafts" else None)
    assert set(eng.graph_status()) >= {"propose", "observe", f"policy.step[{len(ps)}x256]"}


@pytest.mark.timeout(240)
def test_a_one_row_turn_reuses_the_two_row_compilation(trained, monkeypatch):
    """bucket_batch under "compiled": a turn with one row left runs in the two-row state, so it needs no compilation
    of its own (dynamo specializes a size of 1; in a multi-turn run that recompilation landed in a later step)."""
    from repro.rollout import compiled_layers as cl
    pol, prompts, drafts = trained
    pol.set_taps(drafts["eagle3"].tap_spec)
    ps = ragged(prompts)
    monkeypatch.setattr(cl, "_COMPILED", {})
    torch._dynamo.reset()
    eng = RolloutEngine(pol, proposer(drafts["eagle3"]), cuda_graphs="compiled", compile_backend="eager",
                        bucket_batch=True)
    kw = {"max_new_tokens": 8, "greedy": True}
    for rows in (ps[:4], ps[:2]):                    # the states of four and two rows, compiled
        eng.generate(rows, **kw)
    with torch._dynamo.config.patch(error_on_recompile=True):
        one = eng.generate(ps[:1], **kw)
    assert one.tokens == RolloutEngine(pol, proposer(drafts["eagle3"])).generate(ps[:1], **kw).tokens


@pytest.mark.timeout(60)
def test_all_static_sampling_equals_itself_and_differs_by_seed(trained):
    """Sampling on the static path: a seed fixes the output; another seed changes it; AL stays in range."""
    pol, prompts, drafts = trained
    d = drafts["dspark"]
    pol.set_taps(d.tap_spec)
    eng = RolloutEngine(pol, proposer(d), cuda_graphs="all")
    ps = ragged(prompts)
    a = eng.generate(ps, max_new_tokens=12, temperature=0.8, seed=1)
    b = eng.generate(ps, max_new_tokens=12, temperature=0.8, seed=1)
    c = eng.generate(ps, max_new_tokens=12, temperature=0.8, seed=2)
    assert a.tokens == b.tokens and a.logprobs == b.logprobs
    assert a.tokens != c.tokens
    assert all(len(t) == 12 for t in a.tokens)
    assert 1.0 <= a.counters.acceptance_length <= d.num_proposals + 1


@pytest.mark.timeout(60)
def test_all_static_edge_requests(trained):
    pol, _, drafts = trained
    d = drafts["eagle3"]
    pol.set_taps(d.tap_spec)
    eng = RolloutEngine(pol, proposer(d), cuda_graphs="all")
    one = eng.generate([[1, 2, 3]], max_new_tokens=1, greedy=True)
    assert one.tokens == RolloutEngine(pol).generate([[1, 2, 3]], max_new_tokens=1, greedy=True).tokens
    assert one.policy_forwards == 1 and one.finish_reason == ["length"]
    capped = RolloutEngine(pol, proposer(d), cuda_graphs="all", max_draft_slots=40)
    with pytest.raises(ValueError, match=r"needs 61 draft cache slots per row .* over max_draft_slots=40"):
        capped.generate([[1, 2, 3, 4, 5]], max_new_tokens=15, greedy=True)
    with pytest.raises(ValueError, match=r"needs a cuda_graphs mode other than 'off' \(one of \('draft', 'all'"):
        RolloutEngine(pol, proposer(d), bucket_batch=True)
    assert RolloutEngine(pol, cuda_graphs="all").static_decoder is not None


@pytest.mark.timeout(180)
@pytest.mark.parametrize("family", ("plain", *FAMILIES))
def test_all_static_under_replay_emulation(trained, family, monkeypatch):
    """The graphed calls under CPU replay emulation (static inputs copied in, static outputs overwritten by
    every call, warm-up runs first): the same tokens as the eager static path, over requests of two shapes,
    greedy and sampled. A buffer passed anew where a graph writes in place, or an output kept across steps,
    would diverge here as it would on a GPU. The emulated engine left-pads prompts to the prompt bucket as a GPU
    does for its graphed prefill and the draft's graphed observe of the prompt (one graph per bucket); the eager
    one does not pad."""
    pol, prompts, drafts = trained
    if family != "plain":
        pol.set_taps(drafts[family].tap_spec)
    make = (lambda: None) if family == "plain" else (lambda: proposer(drafts[family]))
    ps = ragged(prompts)
    stop = RolloutEngine(pol).generate(ps, max_new_tokens=12, greedy=True).tokens[1][4]
    requests = [(ps, True, 0), (ps[:3], False, 1), (ps, False, 2), (ps, True, 3)]
    eager = RolloutEngine(pol, make(), cuda_graphs="all")
    want = [eager.generate(p, max_new_tokens=12, greedy=g, temperature=0.9, seed=s, stop_tokens=[stop])
            for p, g, s in requests]
    monkeypatch.setattr(GraphedCallable, "emulate_replay", True)
    eng = RolloutEngine(pol, make(), cuda_graphs="all")
    assert eager.static_decoder.prompt_bucket == 1           # a CPU's static path: no padding
    eng.static_decoder.prompt_bucket = PROMPT_BUCKET         # a GPU's
    if family != "plain":
        assert not eng.proposer.graph_prompt_observe
        eng.proposer.graph_prompt_observe = True
    for (p, g, s), w in zip(requests, want):
        got = eng.generate(p, max_new_tokens=12, greedy=g, temperature=0.9, seed=s, stop_tokens=[stop])
        assert got.tokens == w.tokens and got.finish_reason == w.finish_reason
        assert got.counters.as_dict() == w.counters.as_dict()
        torch.testing.assert_close(torch.tensor(sum(got.logprobs, [])), torch.tensor(sum(w.logprobs, [])),
                                   rtol=0, atol=1e-5)
    status = eng.graph_status()
    assert status and all(v["replays"] > 0 for k, v in status.items()
                          if k.startswith(("engine.accept", "policy.step", "policy.prefill[6x")))
    if family != "plain":         # the last request's state: a graph for the prompt's observe (its tokens' width)
        widths = {shapes[0][0][1] for shapes, _ in eng.proposer._graphs["observe"]._graphs}
        assert widths == {PROMPT_BUCKET, eng.k + 1} and status["observe"]["eager_calls"] == 0


def test_whole_step_sizes_are_dynamic_on_a_gpu(monkeypatch):
    """traced_whole on a GPU: dynamic sizes (one compilation serves every state and view), shared between engines."""
    import repro.decoding.static_kv as static_kv
    seen = []
    monkeypatch.setattr(static_kv.torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    for device in ("cuda", torch.device("cuda", 0)):
        assert static_kv.traced_whole(lambda x: x + 1, "eager", device=device, dynamic_ints=("view",))(1) == 2
    # (isolate_recompiles: torch 2.12's; an older torch's compile is given none); the modules stay guarded (steps
    # replay as CUDA graphs there, past dynamo's guards)
    assert all(kw["dynamic"] is True and not kw.get("isolate_recompiles") and kw["fullgraph"] for kw in seen)
    assert not any("guard_filter_fn" in (kw["options"] or {}) for kw in seen)
    seen.clear()
    static_kv.traced_whole(lambda x: x + 1, "inductor", device="cpu", dynamic_ints=("view",))
    native = "recompile_limit" in static_kv._COMPILE_ARGS
    assert ("guard_filter_fn" in seen[0]["options"]) is native and bool(seen[0].get("isolate_recompiles")) is native


def test_whole_step_compiles_on_a_torch_without_recompile_regions(monkeypatch):
    """torch.compile before 2.12 takes neither recompile_limit nor isolate_recompiles (the GPU machines' torch 2.11
    raised a TypeError): traced_whole passes only the arguments this torch's compile has, and raises dynamo's
    process-wide recompile limit around its calls instead."""
    import repro.decoding.static_kv as static_kv
    seen = []
    monkeypatch.setattr(static_kv.torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    monkeypatch.setattr(static_kv, "_COMPILE_ARGS", frozenset({"backend", "dynamic", "fullgraph", "options"}))
    limits = []

    def step(x, *, view=0):
        limits.append(torch._dynamo.config.recompile_limit)
        return x + 1
    with torch._dynamo.config.patch(recompile_limit=8):     # (monkeypatch.setattr would delete it on undo)
        for device, ints in (("cuda", ()), ("cpu", ()), ("cpu", ("view",))):
            assert static_kv.traced_whole(step, "eager", device=device, dynamic_ints=ints)(1, view=3) == 2
        # ... and dynamo's own limit is the one a recompile region would have had, around each call only
        assert limits == [static_kv.WHOLE_RECOMPILE_LIMIT] * 3 and torch._dynamo.config.recompile_limit == 8
    assert len(seen) == 3 and not any({"recompile_limit", "isolate_recompiles"} & set(kw) for kw in seen)


@pytest.mark.timeout(120)
def test_whole_step_sizes_are_static_on_a_cpu_but_the_views():
    """traced_whole on a CPU: each batch a static compilation (inductor's C++ kernels vectorize over static sizes),
    also after another engine compiled the same function at another batch; the named integer arguments (attention
    views) symbolic from the first compilation, so a request's growing view never recompiles."""
    from repro.decoding.static_kv import traced_whole
    graphs = []

    def backend(gm, example_inputs):
        graphs.append([n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"])
        return gm.forward

    def symbolic(values, kind):       # the graph's symbolic integers, or its tensors with a symbolic size
        if kind is torch.Tensor:
            return [v for v in values if isinstance(v, kind) and any(isinstance(s, torch.SymInt) for s in v.shape)]
        return [v for v in values if isinstance(v, kind)]

    def step(x, *, view):
        return x[:, :view].sum(1) * 2

    torch._dynamo.reset()
    one, other = (traced_whole(step, backend, device="cpu", dynamic_ints=("view",)) for _ in range(2))
    x = torch.arange(16.0).reshape(2, 8)
    assert torch.equal(one(x, view=4), x[:, :4].sum(1) * 2)
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert torch.equal(one(x, view=6), x[:, :6].sum(1) * 2)
    assert len(graphs) == 1 and symbolic(graphs[0], torch.SymInt) and not symbolic(graphs[0], torch.Tensor)
    one(torch.ones(3, 8), view=4)
    other(torch.ones(5, 8), view=4)
    assert len(graphs) == 3 and not any(symbolic(g, torch.Tensor) for g in graphs)


@pytest.mark.skipif("recompile_limit" not in inspect.signature(torch.compile).parameters,
                    reason="recompile regions (and so the unguarded modules) need torch 2.12")
@pytest.mark.timeout(120)
def test_whole_step_on_a_cpu_reads_its_modules_unguarded_in_its_own_region():
    """On a CPU, traced_whole's graphs carry no guards on the modules they read (thousands of checks a call), which
    is safe as the engine uses them: each function its own recompile region (two engines' steps, the same code over
    different modules, compile apart: a shared graph would run on the other module's shapes unchecked), weights
    updated in place are read afresh at each call, and the views stay symbolic inside symbolic_views."""
    from repro.decoding.static_kv import VIEW_ARGS, symbolic_views, traced_whole
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    class Engine:
        def __init__(self, width):
            self.lin = torch.nn.Linear(4, width)

        def step(self, x, *, view):
            return self.lin(x)[:, :view]

    torch._dynamo.reset()
    narrow, wide = Engine(4), Engine(8)
    steps = [traced_whole(e.step, backend, device="cpu", dynamic_ints=VIEW_ARGS) for e in (narrow, wide)]
    x = torch.randn(2, 4)
    with torch.no_grad(), symbolic_views():
        for e, step in zip((narrow, wide), steps):
            assert torch.equal(step(x, view=3), e.lin(x)[:, :3])
        assert len(graphs) == 2, "each engine's step compiled in its own region"
        narrow.lin.weight.mul_(2)                                        # an in-place update (a draft's push)
        with torch._dynamo.config.patch(error_on_recompile=True):
            assert torch.equal(steps[0](x, view=4), narrow.lin(x)[:, :4])  # new weights, a new view, no recompile
            assert torch.equal(steps[1](x, view=7), wide.lin(x)[:, :7])
    assert len(graphs) == 2


@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", ("plain",) + FAMILIES)
def test_every_step_request_meets_every_graph_a_longer_request_would(trained, family, monkeypatch):
    """The attention views of the static steps grow with the steps a request takes, and each view is a graph of its
    own, so a request whose rows run longer than any before captures new graphs. ``every_step=True`` (a warm-up's)
    runs all the steps a request can take: the same tokens, and afterwards requests of that shape capture nothing,
    however long their rows run. The control, an engine that ran the same request without it, does capture."""
    pol, prompts, drafts = trained
    if family != "plain":
        pol.set_taps(drafts[family].tap_spec)
    make = (lambda: None) if family == "plain" else (lambda: proposer(drafts[family]))
    ps = [list(p) for p in prompts[:4]]
    sampled = RolloutEngine(pol).generate(ps, max_new_tokens=160, temperature=1.0, seed=0).tokens
    frequent = [t for t, _ in collections.Counter(sum(sampled, [])).most_common(3)]   # rows stop early, unevenly
    kw = dict(max_new_tokens=160, temperature=1.0, stop_tokens=frequent)
    monkeypatch.setattr(GraphedCallable, "emulate_replay", True)
    warm, control = RolloutEngine(pol, make(), cuda_graphs="all"), RolloutEngine(pol, make(), cuda_graphs="all")
    first = warm.generate(ps, seed=0, every_step=True, **kw)
    assert_same_rollout(first, control.generate(ps, seed=0, **kw))
    longest = max(map(len, first.tokens))

    def captures(eng, seed, **extra):
        n0 = GraphedCallable.total_captures
        out = eng.generate(ps, seed=seed, **{**kw, **extra})
        return GraphedCallable.total_captures - n0, max(map(len, out.tokens))

    rare = [t for t in range(pol.vocab_size) if t not in sum(sampled, [])][:3]     # rows run to the limit
    later = [captures(warm, s) for s in range(1, 4)] + [captures(warm, 4, stop_tokens=rare)]
    # a smaller budget (a multi-turn episode's later turn): the same graphs, the budget read from a device buffer
    later += [captures(warm, 5, stop_tokens=rare, max_new_tokens=budget) for budget in (97, 31)]
    assert [n for n, _ in later] == [0] * 6
    assert later[3][1] >= longest + VIEW_BUCKET         # a request running past views the warm-up's rows reached
    assert [n for _, n in later[4:]] == [97, 31]
    assert captures(control, 4, stop_tokens=rare)[0] > 0
    # a graph per attention view, but one memory pool per graphed call: a state holds its largest graph's memory
    status = warm.graph_status()
    assert max(s["graphs"] for s in status.values()) > 1
    assert {call: s["pools"] for call, s in status.items() if s["graphs"]} == {
        call: 1 for call, s in status.items() if s["graphs"]}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("family, batching", [("plain", "bucketed"), ("dspark", "bucketed"), ("eagle3", "bucketed"),
                                              ("dspark", "training batch")])
def test_warm_up_meets_every_graph_of_the_turns_within_its_bound(trained, family, batching, monkeypatch):
    """A multi-turn episode's turns: fewer rows as episodes end, longer prompts (its tokens and observations so far),
    smaller budgets. After ``warm_up(rows, longest, max_new_tokens)`` no turn within those bounds captures a graph
    (prompts padded to the GPU's 16-token buckets; batches to powers of two, or every turn on the training batch's
    rows as a trainer on a GPU runs them, ``min_static_rows``); an engine without it does. The turns' tokens are
    those of the engine without it."""
    pol, prompts, drafts = trained
    if family != "plain":
        pol.set_taps(drafts[family].tap_spec)
    make = (lambda: None) if family == "plain" else (lambda: proposer(drafts[family]))
    monkeypatch.setattr(GraphedCallable, "emulate_replay", True)

    def engine():
        rows = dict(bucket_batch=True) if batching == "bucketed" else dict(min_static_rows=4)
        eng = RolloutEngine(pol, make(), cuda_graphs="all", **rows)
        eng.static_decoder.prompt_bucket = PROMPT_BUCKET         # the GPU's padding (a CPU pads to the token)
        return eng

    warm, control = engine(), engine()
    kw = dict(temperature=1.0, stop_tokens=[5, 9])
    batches = 2 if batching == "bucketed" else 1          # of 4 and 2 rows, or of 4; widths 48, 32, 16
    assert warm.warm_up(4, 40, 24, greedy=False, **kw) == batches * 3
    g = torch.Generator().manual_seed(0)
    grown = [p + torch.randint(0, 127, (n,), generator=g).tolist() for p, n in zip(prompts[:4], (3, 30, 12, 36))]
    turns = [(prompts[:4], 24), (grown, 20), (grown[1:], 13), (grown[3:], 4), (grown[2:3], 24)]
    captured = {"warm": 0, "control": 0}
    for i, (ps, budget) in enumerate(turns):
        out = {}
        for name, eng in (("warm", warm), ("control", control)):
            n0 = GraphedCallable.total_captures
            out[name] = eng.generate(ps, max_new_tokens=budget, seed=i, **kw)
            captured[name] += GraphedCallable.total_captures - n0
        assert_same_rollout(out["warm"], out["control"])
    assert captured["warm"] == 0 and captured["control"] > 0
    with pytest.raises(ValueError, match="warm_up needs a static-cache engine"):
        RolloutEngine(pol, make()).warm_up(4, 40, 24, greedy=True, temperature=1.0)


@pytest.mark.timeout(120)
def test_warm_up_widths_follow_the_prefill_padding(trained, monkeypatch):
    """Padded prompts (one prefill graph per width): a request per width, widest first. Unpadded ones (a CPU, or
    the fused mode, which graphs no prefill): a request every VIEW_BUCKET tokens, each meeting every attention view
    from its prompt's on. Widths past what max_model_len allows with the budget are left out."""
    pol, _, _ = trained
    eng = RolloutEngine(pol, cuda_graphs="all", min_static_rows=4, max_model_len=180)
    widths = []
    generate = eng.generate
    monkeypatch.setattr(eng, "generate", lambda ps, **kw: widths.append((len(ps), len(ps[0]))) or generate(ps, **kw))
    assert eng.static_decoder.prompt_bucket == 1
    assert eng.warm_up(3, 150, 8, greedy=True, temperature=1.0) == 3
    assert widths == [(3, 150), (3, 150 - VIEW_BUCKET), (3, 150 - 2 * VIEW_BUCKET)]
    widths.clear()
    eng.static_decoder.prompt_bucket = PROMPT_BUCKET
    assert eng.warm_up(2, 170, 8, greedy=True, temperature=1.0) == 11        # 172 allowed: widths 172, 160, ..., 16
    assert widths == [(2, 172)] + [(2, w) for w in range(160, 0, -PROMPT_BUCKET)]


@pytest.mark.timeout(60)
def test_every_step_needs_a_static_cache_engine(trained):
    pol, prompts, _ = trained
    with pytest.raises(ValueError, match="every_step=True needs a static-cache engine .* got cuda_graphs='off'"):
        RolloutEngine(pol).generate([prompts[0]], max_new_tokens=4, every_step=True)
