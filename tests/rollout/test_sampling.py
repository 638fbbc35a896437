"""Exact speculative sampling: committed tokens are distributed as plain sampling from the policy.

Every test uses a fixed seed and a chi-square goodness-of-fit test at level ALPHA = 1e-3 against the
*exact* distribution, so each has a stated false-alarm rate of 0.1% per seed (the seeds are fixed, so
the outcome is deterministic; a broken sampler fails with p-values many orders below ALPHA).

    .venv/bin/python -m pytest -q tests/rollout/test_sampling.py
"""
import pytest
import torch

from repro.decoding.sampling import verify, verify_with_noise
from repro.models.policy import build_policy
from repro.rollout.engine import RolloutEngine

from .helpers import OracleProposer
from .law import chi2_pvalue, exact_pair_laws

ALPHA = 1e-3


@pytest.mark.timeout(30)
@pytest.mark.parametrize("one_hot_draft", [False, True])
def test_verify_first_token_and_bonus_are_exact(one_hot_draft):
    g = torch.Generator().manual_seed(0)
    V, k, N = 6, 2, 60000
    logits = torch.randn(1, k + 1, V, generator=g) * 1.5
    q = torch.softmax(torch.randn(1, k, V, generator=g) * 1.5, -1)
    draft = torch.multinomial(q[0, 0].expand(N, V), 1, generator=g)
    draft = torch.cat([draft, torch.multinomial(q[0, 1].expand(N, V), 1, generator=g)], 1)
    v = verify(logits.expand(N, -1, -1), draft, None if one_hot_draft else q.expand(N, -1, -1),
               greedy=False, generator=g)
    # first committed token: the draft's if accepted, else the residual sample
    first = torch.where(v.accepted > 0, draft[:, 0], v.next_token)
    p0 = torch.softmax(logits[0, 0], -1)
    counts = torch.bincount(first, minlength=V)
    if not one_hot_draft:
        assert chi2_pvalue(counts, p0) > ALPHA
    else:  # a one-hot draft's token was sampled from q but declared deterministic: only the
        # conditional law given the proposal is exact, so test it per proposed token
        for t in range(V):
            rows = draft[:, 0] == t
            assert chi2_pvalue(torch.bincount(first[rows], minlength=V), p0) > ALPHA
    # the bonus token after full acceptance is distributed as p_k
    full = v.accepted == k
    assert full.sum() > 1000
    assert chi2_pvalue(torch.bincount(v.next_token[full], minlength=V), torch.softmax(logits[0, k], -1)) > ALPHA


@pytest.mark.timeout(30)
def test_verify_detects_a_wrong_sampler():
    """The same statistic rejects a sampler that skips the residual (resamples from p): the test has power."""
    g = torch.Generator().manual_seed(1)
    V, N = 6, 60000
    p = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    d = torch.multinomial(q.expand(N, V), 1, generator=g)[:, 0]
    acc = torch.rand(N, generator=g) * q[d] < p[d]
    wrong = torch.where(acc, d, torch.multinomial(p.expand(N, V), 1, generator=g)[:, 0])
    assert chi2_pvalue(torch.bincount(wrong, minlength=V), p) < 1e-6


@pytest.mark.timeout(120)
def test_engine_sampling_matches_policy_distribution():
    V, prompt, N, temp = 12, [3, 1, 4], 2500, 0.9
    pol = build_policy("qwen3", "tiny", seed=7, vocab_size=V, init_std=0.2)
    prompts = [prompt] * N
    prop = OracleProposer(pol, k=3, prompts=prompts, noise=1.5)
    out = RolloutEngine(pol, prop).generate(prompts, max_new_tokens=3, temperature=temp, seed=11)
    c = out.counters
    assert 1.3 < c.acceptance_length < 3.7, c.as_dict()       # proposals both accepted and rejected
    toks = torch.tensor(out.tokens)                              # [N, 3]
    joint12, joint23 = exact_pair_laws(pol, prompt, temperature=temp)
    h12 = torch.bincount(toks[:, 0] * V + toks[:, 1], minlength=V * V)
    h23 = torch.bincount(toks[:, 1] * V + toks[:, 2], minlength=V * V)
    assert chi2_pvalue(h12, joint12) > ALPHA
    assert chi2_pvalue(h23, joint23) > ALPHA


@pytest.mark.timeout(30)
def test_verify_with_cut_chains_is_exact():
    """Rows whose draft proposes fewer than k tokens (num_valid): residual or bonus at the cut, still exact."""
    g = torch.Generator().manual_seed(3)
    V, k, N = 5, 3, 60000
    logits = torch.randn(1, k + 1, V, generator=g) * 1.5
    q = torch.softmax(torch.randn(1, k, V, generator=g), -1).expand(N, -1, -1)
    d = torch.stack([torch.multinomial(q[0, i].expand(N, V), 1, generator=g)[:, 0] for i in range(k)], 1)
    nv = torch.randint(0, k + 1, (N,), generator=g)
    v = verify(logits.expand(N, -1, -1), d, q, greedy=False, generator=g, num_valid=nv)
    assert bool((v.accepted <= nv).all())
    first = torch.where(v.accepted > 0, d[:, 0], v.next_token)
    assert chi2_pvalue(torch.bincount(first, minlength=V), torch.softmax(logits[0, 0], -1)) > ALPHA
    for n in range(k + 1):          # after all valid proposals accepted the bonus comes from p[n]
        rows = (nv == n) & (v.accepted == n)
        assert chi2_pvalue(torch.bincount(v.next_token[rows], minlength=V), torch.softmax(logits[0, n], -1)) > ALPHA
    with pytest.raises(ValueError, match="num_valid must be"):
        verify(logits, d[:1], q[:1], greedy=False, num_valid=torch.tensor([4]))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["off", "all"])
@pytest.mark.parametrize("family", ["eagle3_reduced_vocab", "dflash", "dspark"])
def test_real_drafts_sample_the_policy_distribution(family, mode):
    """The drafts' own proposal distributions (reduced-vocabulary EAGLE-3 mapped to the target
    vocabulary, DFlash's per-slot head, DSpark's sequential Markov chain) keep sampling exact, on the
    growing caches (``off``) and on the static caches with the device-side acceptance (``all``)."""
    from repro.models.block_draft import BlockDraftConfig, BlockProposer
    from repro.models.dflash import DFlashDraft
    from repro.models.dspark import DSparkDraft
    from repro.models.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Proposer
    from repro.models.vocab import build_draft_vocab

    V, prompt, N, temp = 12, [3, 1, 4], 2000, 1.0
    pol = build_policy("qwen3", "tiny", seed=8, vocab_size=V, init_std=0.2)
    torch.manual_seed(0)
    if family.startswith("eagle3"):
        d2t, t2d = build_draft_vocab(torch.arange(V, 0, -1).float(), 8)
        d = Eagle3Draft(Eagle3Config.from_policy(pol, draft_vocab_size=8), d2t=d2t, t2d=t2d)
        d.init_from_policy(pol)
        prop = Eagle3Proposer(d, 3)
    else:
        cfg = BlockDraftConfig.from_policy(pol, num_layers=1, block_size=3)
        d = (DFlashDraft if family == "dflash" else DSparkDraft)(cfg, pol)
        if family == "dspark":
            torch.nn.init.normal_(d.markov_out.weight, std=0.5)    # make the Markov bias matter
        prop = BlockProposer(d)
    pol.set_taps(d.tap_spec)
    out = RolloutEngine(pol, prop, cuda_graphs=mode).generate([prompt] * N, max_new_tokens=3, temperature=temp,
                                                               seed=12)
    assert 1.05 < out.counters.acceptance_length < prop.num_proposals + 1
    toks = torch.tensor(out.tokens)
    joint12, joint23 = exact_pair_laws(pol, prompt, temperature=temp)
    assert chi2_pvalue(torch.bincount(toks[:, 0] * V + toks[:, 1], minlength=V * V), joint12) > ALPHA
    assert chi2_pvalue(torch.bincount(toks[:, 1] * V + toks[:, 2], minlength=V * V), joint23) > ALPHA


@pytest.mark.timeout(120)
def test_static_plain_decoding_samples_the_policy_distribution():
    """Plain decoding on the static path (first token and every later one drawn by the noise race)."""
    V, prompt, N, temp = 12, [3, 1, 4], 2500, 0.9
    pol = build_policy("qwen3", "tiny", seed=7, vocab_size=V, init_std=0.2)
    out = RolloutEngine(pol, cuda_graphs="all").generate([prompt] * N, max_new_tokens=3, temperature=temp, seed=5)
    toks = torch.tensor(out.tokens)
    joint12, joint23 = exact_pair_laws(pol, prompt, temperature=temp)
    assert chi2_pvalue(torch.bincount(toks[:, 0] * V + toks[:, 1], minlength=V * V), joint12) > ALPHA
    assert chi2_pvalue(torch.bincount(toks[:, 1] * V + toks[:, 2], minlength=V * V), joint23) > ALPHA


@pytest.mark.timeout(30)
@pytest.mark.parametrize("one_hot_draft", [False, True])
def test_verify_with_noise_is_exact(one_hot_draft):
    """The graph-safe acceptance (noise drawn beforehand) draws the first committed token and the bonus
    from the policy's law; a residual that skips the rejection correction would fail."""
    g = torch.Generator().manual_seed(5)
    V, k, N = 6, 2, 60000
    logits = (torch.randn(1, k + 1, V, generator=g) * 1.5).expand(N, -1, -1)
    q = torch.softmax(torch.randn(1, k, V, generator=g), -1).expand(N, -1, -1)
    d = torch.stack([torch.multinomial(q[0, i].expand(N, V), 1, generator=g)[:, 0] for i in range(k)], 1)
    v = verify_with_noise(logits, d, None if one_hot_draft else q, greedy=False,
                          accept_noise=torch.rand(N, k, generator=g), token_noise=torch.rand(N, V, generator=g))
    first = torch.where(v.accepted > 0, d[:, 0], v.next_token)
    assert chi2_pvalue(torch.bincount(first, minlength=V), torch.softmax(logits[0, 0], -1)) > ALPHA
    rows = v.accepted == k
    assert chi2_pvalue(torch.bincount(v.next_token[rows], minlength=V), torch.softmax(logits[0, k], -1)) > ALPHA
    skipped = torch.where(v.accepted > 0, d[:, 0], torch.multinomial(torch.softmax(logits[:, 0], -1), 1,
                                                                     generator=g)[:, 0])
    assert chi2_pvalue(torch.bincount(skipped, minlength=V), torch.softmax(logits[0, 0], -1)) < 1e-6
    with pytest.raises(ValueError, match="sampling needs token_noise"):
        verify_with_noise(logits, d, q, greedy=False)
