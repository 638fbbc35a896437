"""The policy's decode steps attend through grouped_sdpa (repro.models.policy_attention), which on a static cache also
writes each layer's keys/values, and equal stock SDPA."""
import contextlib

import pytest
import torch

from kernels.attention.grouped import grouped_sdpa_write
from repro.models.policy import build_policy
from repro.models.policy_attention import GROUPED_SDPA, grouped_attention


@pytest.mark.timeout(60)
def test_policy_steps_through_grouped_attention_equal_stock_sdpa(monkeypatch):
    """The static-cache prefill and decode steps attend through grouped_sdpa_write (every layer, both steps: the
    cache's update hands the keys/values through and the attention writes them) and the block restores ``sdpa``;
    their logits and the cache they leave equal the same steps on transformers' SDPA (repeated keys), whose cache
    the update writes."""
    import repro.models.policy as policy_module
    import repro.models.policy_attention as policy_attention
    pol = build_policy("qwen3", "tiny", seed=0)
    assert pol.config.num_attention_heads != pol.config.num_key_value_heads
    ids = torch.randint(0, pol.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))

    def run():
        cache = pol.new_static_cache(2, 32)
        cache.start()
        with torch.no_grad():
            a = pol.decode_step_static(ids[:, :6], torch.arange(6).expand(2, -1), cache).logits
            b = pol.decode_step_static(ids[:, 6:], torch.full((2, 1), 6), cache).logits
        assert not cache.write_on_attend
        return a, b, cache.keys, cache.values

    calls = []
    monkeypatch.setattr(policy_attention, "grouped_sdpa_write",
                        lambda *a, **kw: calls.append(1) or grouped_sdpa_write(*a, **kw))
    got = run()
    assert len(calls) == 2 * pol.num_layers and pol.config._attn_implementation == "sdpa"
    monkeypatch.setattr(policy_module, "grouped_attention", lambda *a, **kw: contextlib.nullcontext())
    want = run()
    assert len(calls) == 2 * pol.num_layers
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5)
    with grouped_attention(pol.model):
        assert pol.config._attn_implementation == GROUPED_SDPA
    assert pol.config._attn_implementation == "sdpa"
