"""Our speculative rollout engine (its caches and samplers live one level down, in repro.decoding).

proposer.py      the Proposer contract a draft family implements for the engine
engine.py        RolloutEngine: batched decoding with or without a draft, acceptance counters
static_loop.py   the engine's static decode loop (cuda_graphs="all"): decisions on the device
result.py        what every engine is asked and returns (the vLLM one, integrations/vllm/engine.py, too)
samples.py       the policy's own samples for offline draft training
peers.py         the decode benchmark's peers (transformers generate, vLLM)
self_check.py    the engine self-check of a GPU run
"""
