"""Pipeline parallelism of the policy with the draft on the last stage, fed by TapChannel.

draft_interface  the contract every draft satisfies (TapDraft, TargetFeatures, tap convention)
partition        layer ranges per stage, tap -> stage
model            Qwen3 (transformers) cut into stage modules
taps             forward hooks feeding TapChannel, microbatch tracking
cp_batch         a padded microbatch packed and sharded zigzag over a CP group (policy and draft rows)
eagle_draft      a one-layer EAGLE-3-style draft used by the harness tests
harness          PP runs on torch.distributed.pipelining schedules (1F1B, interleaved, ZBV)
reference        the single-process run the harness is checked against
"""
