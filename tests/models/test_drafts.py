"""The three draft families: loss and mask vs the fp64 dense reference, training == inference, lossless
speculative decoding with each trained draft, and clear errors on bad input.

    .venv/bin/python -m pytest -q tests/models/test_drafts.py
"""
import pytest
import torch

from repro.models.block_draft import BlockDraftConfig, BlockProposer, sample_anchors
from repro.models.dflash import DFlashDraft
from repro.models.dspark import DSparkDraft
from repro.models.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Proposer
from repro.models.policy import build_policy
from repro.models.taps import TapSpec
from repro.models.train_draft import policy_batch, train_draft
from repro.models.vocab import build_draft_vocab, check_vocab_maps
from repro.rollout.engine import RolloutEngine
from repro.rollout.samples import sample_sequences

FAMILIES = ("eagle3", "dflash", "dspark")


def make_draft(family, policy, draft_vocab=0):
    torch.manual_seed(0)
    if family == "eagle3":
        kw = {}
        if draft_vocab:
            counts = torch.arange(policy.vocab_size, 0, -1).float()
            kw = dict(zip(("d2t", "t2d"), build_draft_vocab(counts, draft_vocab)))
        d = Eagle3Draft(Eagle3Config.from_policy(policy, ttt_steps=3, draft_vocab_size=draft_vocab), **kw)
        d = d.to(policy.dtype)
        d.init_from_policy(policy)
        return d, lambda: Eagle3Proposer(d, 3)
    cfg = BlockDraftConfig.from_policy(policy, num_layers=2, block_size=4, num_anchors=6)
    d = (DFlashDraft if family == "dflash" else DSparkDraft)(cfg, policy).to(policy.dtype)
    return d, lambda: BlockProposer(d)


def loss_of(family, d, feats, batch, anchors, valid, attn_impl):
    taps = feats.concat(d.tap_layers)
    if family == "eagle3":
        return d.ttt_loss(batch.input_ids, taps, batch.policy_logits, batch.loss_mask, attn_impl=attn_impl)[0]
    if family == "dflash":
        return d.loss(batch.input_ids, taps, batch.loss_mask, anchors=anchors, anchor_valid=valid,
                      attn_impl=attn_impl)
    return d.loss(batch.input_ids, taps, batch.policy_logits, batch.loss_mask, anchors=anchors,
                  anchor_valid=valid, attn_impl=attn_impl)[0]


@pytest.fixture(scope="module")
def policy64():
    return build_policy("qwen3", "tiny", seed=5, dtype=torch.float64, init_std=0.3)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("family", FAMILIES)
def test_loss_and_grads_match_fp64_dense_reference(policy64, family):
    d, _ = make_draft(family, policy64)
    policy64.set_taps(d.tap_spec)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 127, (n,), generator=g).tolist() for n in (23, 17, 30)]
    feats, batch = policy_batch(policy64, seqs, [5, 3, 9])
    anchors, valid = sample_anchors(batch.loss_mask, 6, g)
    anchors[0, 0], valid[0, 0] = 4, True                     # an anchor at the start of the response
    valid[1, -1] = False                                     # and a padded (invalid) block
    grads = {}
    for impl in ("kernels", "dense", "padded"):
        d.zero_grad(set_to_none=True)
        loss = loss_of(family, d, feats, batch, anchors, valid, impl)
        loss.backward()
        grads[impl] = (loss.detach(), {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None})
    (lk, gk), (ld, gd) = grads["kernels"], grads["dense"]
    assert torch.isfinite(lk) and lk > 0
    torch.testing.assert_close(lk, ld, rtol=0, atol=1e-10)
    assert gk.keys() == gd.keys() and len(gk) > 5
    for n in gk:
        torch.testing.assert_close(gk[n], gd[n], rtol=0, atol=1e-10, msg=n)
    lp, gp = grads["padded"]                                 # the one-SDPA route of right-padded RL batches
    torch.testing.assert_close(lp, ld, rtol=0, atol=1e-10)
    assert gp.keys() == gd.keys()
    for n in gp:
        torch.testing.assert_close(gp[n], gd[n], rtol=0, atol=1e-10, msg=n)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("family", FAMILIES)
def test_inference_path_reproduces_training_forward(policy64, family):
    """The proposer's cached, ragged-mask forward equals the training forward (trunk+branch masks)."""
    d, make = make_draft(family, policy64)
    policy64.set_taps(d.tap_spec)
    x = torch.randint(0, 127, (1, 24), generator=torch.Generator().manual_seed(2))
    out = policy64.forward_train(x)
    taps = torch.cat(out.taps, -1)
    prop = make()
    prop.reset(1)
    i = 13
    with torch.no_grad():
        if family == "eagle3":
            train = d.ttt_forward(x, taps)                          # per pass [1, S, V]
            prop.observe(x[:, 1:i + 2], [t[:, :i + 1] for t in out.taps], torch.arange(i + 1)[None],
                         torch.ones(1, i + 1, dtype=torch.bool))
            g = prop.g_last
            torch.testing.assert_close(d.logits(g)[0], train[0][0, i], rtol=0, atol=1e-10)
            for m in (1, 2):                                      # TTT pass m == chain step m
                e = d.embed_tokens(x[:, i + m + 1])[:, None]
                g = prop._step(e, g[:, None], torch.tensor([[i + m]]))[:, 0]
                torch.testing.assert_close(d.logits(g)[0], train[m][0, i], rtol=0, atol=1e-10)
        else:
            a = i
            train = d.backbone.forward_blocks(x, taps, torch.tensor([[a]]), torch.tensor([[True]]))[0, 0]
            prop.observe(x[:, 1:a + 1], [t[:, :a] for t in out.taps], torch.arange(a)[None],
                         torch.ones(1, a, dtype=torch.bool))
            infer = prop.block_hidden(x[:, a], torch.tensor([a]))[0]
            torch.testing.assert_close(infer, train, rtol=0, atol=1e-10)


@pytest.fixture(scope="module")
def trained():
    """Each family trained briefly on the tiny policy's own greedy samples (fp32)."""
    pol = build_policy("qwen3", "tiny", seed=6, init_std=0.3)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 127, (4,), generator=g).tolist() for _ in range(24)]
    seqs, plens = sample_sequences(pol, prompts, max_new_tokens=24, greedy=True)
    out = {}
    for fam in FAMILIES:
        d, make = make_draft(fam, pol, draft_vocab=96 if fam == "eagle3" else 0)
        losses = train_draft(d, pol, seqs, plens, steps=30, lr=3e-3, batch_size=8)
        out[fam] = (d, make, losses)
    return pol, prompts, out


@pytest.mark.timeout(200)
@pytest.mark.parametrize("family", FAMILIES)
def test_trained_draft_is_lossless_and_accepts(trained, family):
    pol, prompts, drafts = trained
    d, make, losses = drafts[family]
    assert sum(losses[-5:]) < 0.9 * sum(losses[:5]), losses      # the loss goes down
    pol.set_taps(d.tap_spec)
    for batch in (1, 5):
        ps = prompts[:batch]
        plain = RolloutEngine(pol).generate(ps, max_new_tokens=20, greedy=True)
        prop = make()
        prop.compact_min_waste = 1                      # exercise the draft caches' compaction too
        spec = RolloutEngine(pol, prop).generate(ps, max_new_tokens=20, greedy=True)
        assert spec.tokens == plain.tokens
        for a, b in zip(spec.logprobs, plain.logprobs):    # fp32, logits ~50x a default init's: the
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-5)   # 1e-5
            # absolute contract is pinned in tests/rollout/test_engine.py on a default-scale policy
    assert spec.counters.acceptance_length > 1.1, spec.counters.as_dict()
    # sampling mode runs and returns the policy's log-probs of what it sampled
    out = RolloutEngine(pol, make()).generate(prompts[:3], max_new_tokens=10, temperature=0.7, seed=1)
    for p, t, lp in zip(prompts[:3], out.tokens, out.logprobs):
        with torch.no_grad():
            ref = torch.log_softmax(pol.model(torch.tensor([p + t])).logits[0] / 0.7, -1)
        ref = ref[len(p) - 1:-1].gather(1, torch.tensor(t)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(lp), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(60)
def test_dspark_confidence_schedule_cuts_chains_losslessly(trained):
    pol, prompts, drafts = trained
    d, make, _ = drafts["dspark"]
    pol.set_taps(d.tap_spec)
    plain = RolloutEngine(pol).generate(prompts[:4], max_new_tokens=16, greedy=True)
    d.confidence_threshold = 0.5
    try:
        spec = RolloutEngine(pol, make()).generate(prompts[:4], max_new_tokens=16, greedy=True)
    finally:
        d.confidence_threshold = 0.0
    assert spec.tokens == plain.tokens
    c = spec.counters
    assert c.draft_tokens < c.verify_steps * c.num_proposals      # some chains were cut
    assert c.accepted <= c.draft_tokens


def test_eagle3_reduced_vocab_proposes_only_kept_tokens(trained):
    pol, prompts, drafts = trained
    d, make, _ = drafts["eagle3"]
    prop = make()
    pol.set_taps(d.tap_spec)
    out = RolloutEngine(pol, prop).generate(prompts[:2], max_new_tokens=6, temperature=1.0, seed=2)
    assert len(out.tokens[0]) == 6
    assert d.t2d.sum() == 96 and prop.target_ids.numel() == 96 and bool(d.t2d[prop.target_ids].all())


def test_bad_inputs_raise():
    pol = build_policy("qwen3", "tiny")
    with pytest.raises(ValueError, match=r"tap layer 9 \(output convention\) is out of range"):
        Eagle3Config.from_policy(pol, tap_spec=TapSpec((1, 3, 9), "output", pol.num_layers))
    d2t, t2d = build_draft_vocab(torch.rand(128), 32)
    t2d_bad = t2d.clone()
    t2d_bad[(~t2d).nonzero()[0]] = True
    t2d_bad[t2d.nonzero()[0]] = False
    with pytest.raises(ValueError, match="vocabulary maps disagree: d2t maps draft id 0 to target id"):
        check_vocab_maps(d2t, t2d_bad, 128)
    with pytest.raises(ValueError, match="t2d keeps 33 target tokens but d2t has 32"):
        t2 = t2d.clone()
        t2[(~t2d).nonzero()[0]] = True
        Eagle3Draft(Eagle3Config.from_policy(pol, draft_vocab_size=32), d2t=d2t, t2d=t2)
    with pytest.raises(ValueError, match="outside \\[0, 128\\)"):
        check_vocab_maps(d2t + 200, t2d, 128)
    with pytest.raises(ValueError, match="needs d2t/t2d maps"):
        Eagle3Draft(Eagle3Config.from_policy(pol, draft_vocab_size=32))
    with pytest.raises(ValueError, match="block_size must be >= 2"):
        BlockDraftConfig.from_policy(pol, block_size=1)
    with pytest.raises(ValueError, match="mask_token_id=128 is outside the vocabulary"):
        BlockDraftConfig.from_policy(pol, mask_token_id=128)
    d = DFlashDraft(BlockDraftConfig.from_policy(pol, num_layers=2), pol)
    with pytest.raises(ValueError, match="fused taps have 64 features, expected 128"):
        d.backbone.context(torch.zeros(1, 3, 64))
    with pytest.raises(RuntimeError, match="call draft.attach"):
        DFlashDraft(BlockDraftConfig.from_policy(pol)).backbone.embed(torch.zeros(1, dtype=torch.long))
    pol.set_taps(TapSpec.eagle3_default(pol.num_layers))
    with pytest.raises(ValueError, match=r"taps layers \(1, 3, 4\) but the draft was trained on \(1, 5\)"):
        RolloutEngine(pol, BlockProposer(d))
    with pytest.raises(ValueError, match="needs policy taps"):
        pol.recorder.remove()
        pol.recorder = None
        RolloutEngine(pol, BlockProposer(d))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("family", FAMILIES)
def test_drafts_satisfy_the_pp_tap_contract(policy64, family):
    """Each draft is a ``TapDraft``: fed HF hidden states through the PP harness's contract it gives the
    same loss as when fed from its own tap hooks."""
    from repro.parallel.draft_interface import TapDraft, features_from_hidden_states
    d, _ = make_draft(family, policy64)
    assert isinstance(d, TapDraft)
    policy64.set_taps(d.tap_spec)
    seqs = [torch.randint(0, 127, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (19, 19)]
    feats, batch = policy_batch(policy64, seqs, [4, 6])
    with torch.no_grad():
        hs = policy64.model(batch.input_ids, output_hidden_states=True).hidden_states
    via_contract = features_from_hidden_states(hs, d.tap_layers)
    for fam_feats in (feats, via_contract):
        torch.manual_seed(0)
        batch.extras["anchor_generator"] = torch.Generator().manual_seed(4)
        loss = d.draft_loss(fam_feats, batch)
        assert torch.isfinite(loss)
        if fam_feats is feats:
            ref = loss
    torch.testing.assert_close(loss, ref, rtol=0, atol=1e-12)


@pytest.mark.timeout(60)
def test_sample_anchors_is_a_uniform_subset_of_the_candidates():
    from repro.models.block_draft import sample_anchors
    mask = torch.zeros(3, 12)
    mask[0, 2:10] = 1            # 8 candidates (a + 1 < S holds for all)
    mask[1, 5:] = 1              # 7 positions, the last one (a = 11) is no candidate: 6
    mask[2, 3:5] = 1             # 2 candidates: fewer than N
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(3, 12)
    draws = 4000
    for _ in range(draws):
        a, v = sample_anchors(mask, 4, g)
        assert a.shape == v.shape == (3, 4)
        assert v.sum(1).tolist() == [4, 4, 2]
        for r in range(3):
            picked = a[r][v[r]]
            assert torch.all(picked[1:] > picked[:-1]), "anchors must be sorted and distinct"
            assert torch.all(mask[r, picked] == 1) and torch.all(picked < 11)
            assert torch.all(a[r][~v[r]] == 0)
            counts[r, picked] += 1
    # each candidate of a row is picked with probability N / candidates (4/8, 4/6, 1): with 4000 draws a
    # binomial's 6-sigma band is below +-0.05 (false alarm ~ 1e-9 per cell)
    for r, cand, p in ((0, range(2, 10), 0.5), (1, range(5, 11), 4 / 6), (2, range(3, 5), 1.0)):
        freq = counts[r, list(cand)] / draws
        assert torch.all((freq - p).abs() < 0.05), (r, freq)


def test_eagle3_draft_columns_by_index_equal_the_vocabulary_mask():
    """The TTT loss picks the draft vocabulary's columns with an index (no host sync, CUDA-graph safe): the same
    columns, in the same order, as the bool mask t2d."""
    from repro.models.vocab import build_draft_vocab, draft_to_target_ids
    counts = torch.randint(0, 100, (512,), generator=torch.Generator().manual_seed(0)).float()
    d2t, t2d = build_draft_vocab(counts, 128)
    x = torch.randn(3, 5, 512)
    assert torch.equal(x.index_select(-1, draft_to_target_ids(d2t)), x[..., t2d])
