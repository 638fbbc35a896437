"""Our speculative rollout engine (its caches and samplers live one level down, in repro.decoding).

proposer.py      the Proposer contract a draft family implements for the engine
engine.py        RolloutEngine: batched decoding with or without a draft, acceptance counters
samples.py       the policy's own samples for offline draft training
law.py           the exact law of short completions (the sampling tests' oracle)
vllm_backend.py  the same interface decoded by vLLM (where installed); vllm_export.py writes its checkpoints
"""
