"""Engines sharing CUDA graph memory pools (``shared_graph_pools``, as a lockstep's rows do) under real CUDA graphs:
two policies of the h200 profile's dense shape (28 layers, hidden 1024, 16/8 heads of 128, vocab 512; random init,
bf16) with a fresh DSpark draft each (and without a draft), engine mode ``all``, requests of two batch sizes
alternating between the engines. Prints, per family: whether every result (greedy and sampled) equals the same
engine's alone, and the bytes the CUDA graph pools hold for the two engines alone (a pool per call and request shape
each) and for the two sharing (one per call). Writes nothing.

    PYTHONPATH=. python studies/engine_checks/shared_pools_cuda.py        # on a CUDA machine
"""
import gc
import time

import torch

from repro.decoding.cuda_graph import graph_pool_bytes, shared_graph_pools
from repro.decoding.policy_cache import SharedKVStorage
from repro.models.block_draft import BlockDraftConfig, BlockProposer
from repro.models.dspark import DSparkDraft
from repro.models.policy import build_policy
from repro.rollout.engine import RolloutEngine

DENSE = dict(vocab_size=512, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
             num_key_value_heads=8, head_dim=128)
NEW_TOKENS = 64


def pool_bytes() -> int:
    if not torch.cuda.is_available():
        return 0
    torch.cuda.synchronize()
    return graph_pool_bytes(torch.cuda.memory_snapshot())


def requests(prompts):
    return [(prompts, {"greedy": True}), (prompts[:24], {"greedy": False, "seed": 3}),
            (prompts, {"greedy": False, "seed": 4})]


def run(engines, prompts) -> list:
    return [eng.generate(ps, max_new_tokens=NEW_TOKENS, **kw) for ps, kw in requests(prompts) for eng in engines]


def main():
    t0 = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"       # a CPU runs it eagerly, on the tiny policy
    shape = dict(scale="gpu", dtype=torch.bfloat16, **DENSE) if dev == "cuda" else dict(scale="tiny")
    policies = [build_policy("qwen3", seed=s, device=dev, **shape) for s in (6, 9)]
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(20, 60, (64,), generator=g)
    prompts = [torch.randint(0, 120, (int(n),), generator=g).tolist() for n in lengths]
    draft = DSparkDraft(BlockDraftConfig.from_policy(policies[0], num_layers=2, block_size=8), policies[0])
    draft = draft.to(device=dev, dtype=policies[0].dtype)
    for name, make in (("plain", lambda: None), ("dspark", lambda: BlockProposer(draft))):
        if name == "dspark":                                   # plain first: no taps recorded
            for p in policies:
                p.set_taps(draft.tap_spec)
        b0 = pool_bytes()
        alone = [RolloutEngine(p, make(), cuda_graphs="all") for p in policies]
        want = run(alone, prompts)
        b1 = pool_bytes()
        with shared_graph_pools():
            storage = SharedKVStorage()
            shared = [RolloutEngine(p, make(), cuda_graphs="all", kv_storage=storage) for p in policies]
            got = run(shared, prompts)
        b2 = pool_bytes()
        same = all(a.tokens == b.tokens for a, b in zip(got, want))
        dlp = max((abs(x - y) for a, b in zip(got, want) if a.tokens == b.tokens
                  for ra, rb in zip(a.logprobs, b.logprobs) for x, y in zip(ra, rb)), default=float("nan"))
        fallbacks = {k: v["fallback_reason"] for eng in shared for k, v in eng.graph_status().items()
                     if v.get("fallback_reason")}
        print(f"{name}: results equal={same} max|dlogp|={dlp:.2e} graph pools: alone {(b1 - b0) / 1e9:.2f} GB, "
              f"shared {(b2 - b1) / 1e9:.2f} GB; fallbacks={fallbacks} t={time.time() - t0:.0f}s", flush=True)
        del alone, shared, want, got
        gc.collect()


if __name__ == "__main__":
    main()
