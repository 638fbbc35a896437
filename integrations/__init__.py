"""Where the suite meets outside engines: each package builds on repro (and kernels), never the reverse.

integrations.vllm: vLLM as a rollout engine behind repro.rollout's interface, our policies and drafts written in
the checkpoint layouts vLLM loads and released EAGLE-3 drafts read back from that layout, the vLLM decode benchmark.
integrations.nemo_rl: the paper-scale runs on NeMo-RL (config generation and checks, launch, metric mapping).

repro reaches these only through the dotted names in repro.core.handoffs, imported when a run asks for one.
"""
