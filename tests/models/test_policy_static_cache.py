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
    g = torch.Generator().manual_seed(0)
    pol = build_policy(family, "tiny", seed=0, vocab_size=64)
    B, P = 3, 6
    ids = torch.randint(0, 64, (B, P), generator=g)
    lens = torch.tensor([6, 3, 5])
    pos = torch.arange(P)[None] - (P - lens)[:, None]
    live = pos >= 0
    pos = pos.clamp_min(0)
    dyn, table = pol.new_cache(), SlotTable(B, "cpu")
    static = pol.new_static_cache(B, 128)
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
