"""vLLM behind the suite's interfaces, and its checkpoint layouts (vLLM itself is imported only where it runs).

engine.py  VllmRolloutEngine: RolloutEngine's generate(...) -> RolloutResult, decoded by vLLM (rollout_backend vllm)
export.py  our policies and EAGLE-3 / DFlash drafts written as checkpoint folders vLLM loads (no vLLM needed)
load.py    a released EAGLE-3 draft in that layout read into our Eagle3Draft (no vLLM needed): the runs' warm start
decode.py  the vLLM decode benchmark: throughput and acceptance length with and without our EAGLE-3 draft

    .venv-vllm/bin/python -m integrations.vllm.decode
"""
