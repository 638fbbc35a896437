"""Decoding primitives shared by the drafts (repro.models) and the rollout engine (repro.rollout).

Both import this package; it imports neither (tests/models/test_layering.py checks the direction).

kv.py          SlotTable: slot positions of a ragged KV cache, the inference masks built from them, HF cache helpers
static_kv.py   static-shape caches (slots, keys/values, cursor, batch map) and the graphed proposers' shared state
policy_cache.py  the policy's static KV cache (fixed slots per row, per-row lengths) behind transformers' Cache API
sampling.py    exact verification (rejection sampling, residual, bonus; greedy) and the drafts' samplers
merged_projections.py  q/k/v and gate/up as one product each inside decode steps (parameters become rows of the stacks)
decode_linear.py  a decode step's products: up to 16 rows on a GPU to the Triton kernels (gemv_triton.py), else F.linear
cuda_graph.py  GraphedCallable: capture a callable into a CUDA graph and replay it (eager on CPU or on failure)
"""
