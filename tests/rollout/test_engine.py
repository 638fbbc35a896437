"""Rollout engine: plain decoding vs HF generate, speculative == plain (greedy), oracle acceptance, log-probs.

    .venv/bin/python -m pytest -q tests/rollout/test_engine.py
"""
import pytest
import torch
from transformers import GenerationConfig

from repro.models.policy import build_policy
from repro.rollout.engine import RolloutEngine

from .helpers import OracleProposer

PROMPTS = [[5, 9, 2, 7], [1, 3], [11, 4, 6, 8, 10, 12], [2]]


@pytest.fixture(scope="module")
def policy64():
    return build_policy("qwen3", "tiny", seed=3, dtype=torch.float64, init_std=0.3)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen3_moe", "gpt_oss"])
def test_plain_greedy_matches_hf_generate(family):
    pol = build_policy(family, "tiny", seed=1, dtype=torch.float64, init_std=0.3)
    out = RolloutEngine(pol).generate(PROMPTS, max_new_tokens=20, greedy=True)
    for prompt, toks in zip(PROMPTS, out.tokens):   # one row at a time: HF left-padding would differ
        cfg = GenerationConfig(max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
        ref = pol.model.generate(torch.tensor([prompt]), generation_config=cfg)[0, len(prompt):].tolist()
        assert toks == ref
    assert out.counters.acceptance_length == 1.0 and out.finish_reason == ["length"] * 4


@pytest.mark.timeout(120)
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("noise", [0.0, 3.0])
def test_greedy_speculative_is_token_identical(policy64, batch, noise):
    prompts = PROMPTS[:batch]
    plain = RolloutEngine(policy64).generate(prompts, max_new_tokens=17, greedy=True)
    prop = OracleProposer(policy64, k=3, prompts=prompts, noise=noise)
    spec = RolloutEngine(policy64, prop).generate(prompts, max_new_tokens=17, greedy=True)
    assert spec.tokens == plain.tokens
    for a, b in zip(spec.logprobs, plain.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=1e-9)
    if noise == 0.0:   # the oracle proposes the policy's own greedy tokens: every proposal accepted
        c = spec.counters
        assert c.accepted == c.draft_tokens and c.acceptance_length == 4.0
        assert c.accepted_per_pos == [c.verify_steps] * 3
        assert spec.policy_forwards < plain.policy_forwards / 3
    else:
        assert spec.counters.acceptance_length < 4.0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("greedy", [True, False])
def test_logprobs_equal_fresh_forward_fp32(greedy):
    pol = build_policy("qwen3", "tiny", seed=4, dtype=torch.float32)
    prop = OracleProposer(pol, k=2, prompts=PROMPTS, noise=2.0)
    temp = 1.0 if greedy else 0.8
    out = RolloutEngine(pol, prop).generate(PROMPTS, max_new_tokens=12, greedy=greedy, temperature=temp, seed=5)
    for prompt, toks, lps in zip(PROMPTS, out.tokens, out.logprobs):
        seq = torch.tensor([prompt + toks])
        with torch.no_grad():
            logits = pol.model(seq).logits[0].double()
        ref = torch.log_softmax(logits / temp, -1)[len(prompt) - 1:-1].gather(1, torch.tensor(toks)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(lps, dtype=torch.float64), ref, rtol=0, atol=1e-5)


@pytest.mark.timeout(60)
def test_stop_tokens_and_length_limit(policy64):
    plain = RolloutEngine(policy64).generate(PROMPTS, max_new_tokens=10, greedy=True)
    stop = plain.tokens[0][3]                    # a token row 0 emits at step 4
    prop = OracleProposer(policy64, k=3, prompts=PROMPTS)
    out = RolloutEngine(policy64, prop).generate(PROMPTS, max_new_tokens=10, greedy=True, stop_tokens=[stop])
    for full, got, why in zip(plain.tokens, out.tokens, out.finish_reason):
        if stop in full:
            cut = full.index(stop) + 1
            assert got == full[:cut] and why == "stop"
        else:
            assert got == full and why == "length"
    assert out.finish_reason[0] == "stop" and len(out.tokens[0]) <= 4


@pytest.mark.timeout(30)
def test_bad_input_raises(policy64):
    eng = RolloutEngine(policy64, OracleProposer(policy64, k=3, prompts=[[1] * 10]), max_model_len=16)
    with pytest.raises(ValueError, match=r"prompt 0 has 10 tokens.*over the limit max_model_len=16"):
        eng.generate([[1] * 10], max_new_tokens=8, greedy=True)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        RolloutEngine(policy64).generate([[1, 999]], max_new_tokens=2, greedy=True)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        RolloutEngine(policy64).generate([[1]], max_new_tokens=2, temperature=0.0)


@pytest.mark.timeout(60)
def test_cache_compaction_keeps_outputs_and_bounds_memory(policy64):
    """Rows that accept less leave dead slots; squeezing them out changes no token and bounds the cache."""
    prompts = PROMPTS
    plain = RolloutEngine(policy64).generate(prompts, max_new_tokens=40, greedy=True)
    outs = {}
    for every, waste in ((1, 1), (10**9, 10**9)):
        eng = RolloutEngine(policy64, OracleProposer(policy64, k=4, prompts=prompts, noise=3.0))
        eng.compact_every, eng.compact_min_waste = every, waste
        outs[every] = eng.generate(prompts, max_new_tokens=40, greedy=True)
    on, off = outs[1], outs[10**9]
    assert on.tokens == plain.tokens == off.tokens
    assert on.cache_compactions > 0 and off.cache_compactions == 0
    longest = max(len(p) + len(t) for p, t in zip(prompts, on.tokens))
    assert on.cache_slots <= longest + 4 < off.cache_slots


@pytest.mark.timeout(90)
@pytest.mark.parametrize("family", ["gpt_oss", "qwen3_moe", "llama"])
def test_speculative_greedy_other_families(family):
    """Sliding-window layers (GPT-OSS, window 16 < 30 tokens), MoE routing and Llama keep greedy lossless."""
    pol = build_policy(family, "tiny", seed=2, dtype=torch.float64, init_std=0.3)
    prompts = PROMPTS[:3]
    plain = RolloutEngine(pol).generate(prompts, max_new_tokens=26, greedy=True)
    spec = RolloutEngine(pol, OracleProposer(pol, k=3, prompts=prompts, noise=2.0)).generate(
        prompts, max_new_tokens=26, greedy=True)
    assert spec.tokens == plain.tokens
    assert 1.0 < spec.counters.acceptance_length < 4.0
