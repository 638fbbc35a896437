"""The policy's static KV cache (repro.decoding.policy_cache) against its dynamic cache, every policy family.

Ragged prefill (left padding as dead slots), decode and verify steps of 1-3 tokens, rejected slots killed
after each step, a sliding window (GPT-OSS): logits equal to the DynamicCache path's in fp32, and the fp64
dense reference (a full forward of the row's live tokens) equal to both.

    .venv/bin/python -m pytest -q tests/models/test_policy_static_cache.py
"""
import pytest
import torch

from repro.decoding.kv import SlotTable
from repro.decoding.policy_cache import StaticPolicyCache
from repro.models.policy import FAMILIES, build_policy


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", FAMILIES)
def test_static_cache_steps_equal_the_dynamic_cache(family):
    assert steps_against_the_dynamic_cache(family, 128).compactions == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", ["qwen3", "gpt_oss"])
def test_a_compacting_static_cache_steps_equal_the_dynamic_cache(family):
    """A cache smaller than the columns the steps write (54 here, of which at most 44 a row stay live): it compacts
    when full, and every later step's logits still equal the dynamic cache's and the fp64 reference's; the sliding
    window (GPT-OSS) still masks by position."""
    assert steps_against_the_dynamic_cache(family, 48).compactions >= 1


def steps_against_the_dynamic_cache(family: str, slots: int) -> StaticPolicyCache:
    g = torch.Generator().manual_seed(0)
    pol = build_policy(family, "tiny", seed=0, vocab_size=64)
    B, P = 3, 6
    ids = torch.randint(0, 64, (B, P), generator=g)
    lens = torch.tensor([6, 3, 5])
    pos = torch.arange(P)[None] - (P - lens)[:, None]
    live = pos >= 0
    pos = pos.clamp_min(0)
    dyn, table = pol.new_cache(), SlotTable(B, "cpu")
    static = pol.new_static_cache(B, slots)
    static.start()
    a = pol.decode_step(ids, pos, dyn, table, live).logits
    b = pol.decode_step_static(ids, pos, static, live).logits
    torch.testing.assert_close(a[live], b[live], rtol=0, atol=1e-5)
    rows = [ids[i, P - int(lens[i]):].tolist() for i in range(B)]        # each row's live tokens
    last = pos[:, -1]
    for step in range(24):                   # past the tiny GPT-OSS window (16): the window mask matters
        q = 1 + step % 3
        new = torch.randint(0, 64, (B, q), generator=g)
        qp = last[:, None] + 1 + torch.arange(q)
        a = pol.decode_step(new, qp, dyn, table).logits
        b = pol.decode_step_static(new, qp, static).logits
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        keep = torch.randint(1, q + 1, (B,), generator=g)
        table.kill(table.length - q, keep)
        static.kill(static.cols, keep)
        for i in range(B):
            rows[i] += new[i, :int(keep[i])].tolist()
        last = qp[torch.arange(B), keep - 1]
    # the oracle: a dense fp64 forward of each row's kept tokens gives the last step's kept logits
    ref = build_policy(family, "tiny", seed=0, vocab_size=64, dtype=torch.float64)   # fp64 experts: eager
    ref.model.load_state_dict(pol.model.state_dict())
    for i in range(B):
        x = torch.tensor([rows[i]])
        full = ref.forward_train(x, want_taps=False).logits[0, -int(keep[i]):]
        torch.testing.assert_close(b[i, :int(keep[i])].double(), full, rtol=0, atol=1e-4)
    return static


@pytest.mark.timeout(30)
def test_static_cache_refuses_bad_use():
    with pytest.raises(ValueError, match="needs max_slots >= 1, got 0"):
        StaticPolicyCache(2, 0, num_layers=2, kv_heads=1, head_dim=8, dtype=torch.float32, device="cpu")
    pol = build_policy("qwen3", "tiny", seed=0, vocab_size=32)
    cache = pol.new_static_cache(2, 8)
    cache.start()
    with pytest.raises(ValueError, match=r"positions must be \[batch=2, q\], got \(3, 1\)"):
        pol.decode_step_static(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, 1, dtype=torch.long), cache)
    pol.decode_step_static(torch.zeros(2, 6, dtype=torch.long), torch.arange(6).expand(2, 6), cache)
    with pytest.raises(RuntimeError, match="overflow: a write of 3 slots at column 6 passes max_slots=8"):
        pol.decode_step_static(torch.zeros(2, 3, dtype=torch.long), torch.arange(6, 9).expand(2, 3), cache)
    assert cache.compactions == 1      # it compacted first: every slot was live


@pytest.mark.timeout(30)
def test_compact_moves_live_slots_to_the_front_in_order():
    cache = StaticPolicyCache(2, 6, num_layers=2, kv_heads=1, head_dim=2, dtype=torch.float64, device="cpu")
    cache.slots.pos.copy_(torch.tensor([[-1, 0, -1, 1, 2, -1], [0, 1, -1, -1, -1, 2]]))
    cache.keys.copy_(torch.arange(24.).reshape(2, 1, 12, 1).expand(2, 1, 12, 2))
    cache.values.copy_(-cache.keys)
    before = cache.keys.clone()
    cache.next_col = 6
    assert cache.compact() == 3 and cache.next_col == 3
    assert cache.slots.pos.tolist() == [[0, 1, 2, -1, -1, -1], [0, 1, 2, -1, -1, -1]]
    for layer in range(2):
        k, v = cache.layer(layer, 3)
        at = layer * 6
        torch.testing.assert_close(k[0, 0, :, 0], before[0, 0, [at + 1, at + 3, at + 4], 0], rtol=0, atol=0)
        torch.testing.assert_close(k[1, 0, :, 0], before[1, 0, [at + 0, at + 1, at + 5], 0], rtol=0, atol=0)
        torch.testing.assert_close(v, -k, rtol=0, atol=0)
