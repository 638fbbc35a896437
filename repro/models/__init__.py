"""The paper's models: the policy (HF transformers classes) with taps, and the three draft families.

policy.py        build_policy / load_policy, the Policy wrapper (taps, ragged and static-cache decode steps)
policy_attention.py  the policy's attention on its caches: grouped queries, no repeated keys (transformers' registry)
taps.py          TapSpec (both tap-index conventions, family defaults), TapRecorder hooks
vocab.py         EAGLE-3 reduced vocabulary maps (d2t offsets, t2d mask), built and validated
draft_layers.py  RMSNorm, SwiGLU, RoPE, draft KV cache, cache attention (inference masks from SlotTable)
eagle3.py        EAGLE-3 draft (TTT loss through kernels.attention) and its chain proposer
block_draft.py   DFlash/DSpark backbone (KV injection), anchor sampler, block proposer
dflash.py        DFlash: slots 1..B-1 predict x_{a+s}, decayed CE
dspark.py        DSpark: anchor-predicts layout, Markov head, confidence head, CE + TV + BCE
train_draft.py   offline draft training on the policy's own samples (through the TapDraft contract)
synthetic.py     a synthetic Markov language and a short policy pre-training (benchmarks, no checkpoints)

Caches, masks and samplers come from repro.decoding; nothing here imports the engine (repro.rollout).
Tests: tests/models (taps, drafts vs the fp64 dense reference) and tests/rollout (engine, sampling).
"""
