"""The smallest policy cache under real CUDA graphs, with the garbage collector provoked: a tiny Qwen3 policy and
fresh (untrained, so nearly every proposal is rejected) EAGLE-3 and DSpark drafts, engine modes ``all`` and
``compiled_drafts``; each family's rollouts on the smallest policy cache the request fits (``policy_cache_slots``:
the verify steps write each row's frontier, so it fills to its last columns; caches that wrote every step at a
shared cursor compacted instead, hence the name) against the same on the default cache, greedy and sampled, after
dropping two other
engines into garbage cycles that hold their captured graphs and with ``gc.set_threshold(1)`` around the captures
(a collection during a capture destroyed other graphs and broke it before ``repro.decoding.cuda_graph`` turned the
collector off there). Prints, per family and mode: tokens equal, the largest log-probability difference, the cache
sizes, the compactions and any graph that fell back to eager. Writes nothing.

    PYTHONPATH=. python studies/engine_checks/compaction_cuda.py        # on a CUDA machine (a CPU runs it eagerly)
"""
import gc
import time

import torch

from repro.models.block_draft import BlockDraftConfig, BlockProposer
from repro.models.dspark import DSparkDraft
from repro.models.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Proposer
from repro.models.policy import build_policy
from repro.rollout.engine import RolloutEngine

NEW_TOKENS = 48


def compare(pol, make_proposer, mode: str, prompts) -> str:
    full = RolloutEngine(pol, make_proposer(), cuda_graphs=mode)
    want = full.generate(prompts, max_new_tokens=NEW_TOKENS, greedy=True)
    junk = [RolloutEngine(pol, make_proposer(), cuda_graphs=mode) for _ in range(2)]
    for eng in junk:
        eng.generate(prompts, max_new_tokens=8, greedy=True)
        eng.cycle = eng                  # a garbage cycle holding captured graphs once dropped
    del junk
    slots = full.smallest_policy_cache(full.static_decoder.prompt_columns(max(map(len, prompts))), NEW_TOKENS)
    small = RolloutEngine(pol, make_proposer(), cuda_graphs=mode, policy_cache_slots=slots)
    gc.set_threshold(1)
    try:
        got = small.generate(prompts, max_new_tokens=NEW_TOKENS, greedy=True)
        got_s = small.generate(prompts, max_new_tokens=NEW_TOKENS, greedy=False, seed=3)
    finally:
        gc.set_threshold(700)
    want_s = full.generate(prompts, max_new_tokens=NEW_TOKENS, greedy=False, seed=3)
    dlp = (max(abs(a - b) for x, y in zip(got_s.logprobs, want_s.logprobs) for a, b in zip(x, y))
           if got_s.tokens == want_s.tokens else None)
    fallbacks = {k: v["fallback_reason"] for k, v in small.graph_status().items() if v.get("fallback_reason")}
    return (f"greedy same={got.tokens == want.tokens} sampled same={got_s.tokens == want_s.tokens} "
            f"max|dlogp|={dlp} AL={want.counters.acceptance_length:.2f} slots {got.cache_slots} vs "
            f"{want.cache_slots} compactions={got.cache_compactions + got_s.cache_compactions} fallbacks={fallbacks}")


def main():
    t0 = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    pol = build_policy("qwen3", "tiny", seed=6, init_std=0.3, device=dev)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 127, (int(n),), generator=g).tolist() for n in torch.randint(3, 20, (8,), generator=g)]
    eagle = Eagle3Draft(Eagle3Config.from_policy(pol, ttt_steps=3))
    eagle.init_from_policy(pol)
    eagle = eagle.to(dev)
    dspark = DSparkDraft(BlockDraftConfig.from_policy(pol, num_layers=1, block_size=4, num_anchors=6), pol).to(dev)
    for name, draft, make in (("eagle3", eagle, lambda: Eagle3Proposer(eagle, 3)),
                              ("dspark", dspark, lambda: BlockProposer(dspark))):
        pol.set_taps(draft.tap_spec)
        for mode in ("all", "compiled_drafts"):
            print(f"{name} {mode}: {compare(pol, make, mode, prompts)} t={time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
