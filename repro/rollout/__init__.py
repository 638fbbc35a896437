"""Our speculative rollout engine.

kv.py        SlotTable: slot positions of a ragged KV cache and the inference masks built from them
sampling.py  exact verification: rejection sampling (residual + bonus) and greedy acceptance
proposer.py  the Proposer contract a draft family implements for the engine
engine.py    RolloutEngine: batched decoding with or without a draft, acceptance counters
"""
