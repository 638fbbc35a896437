"""Test-session settings: under pytest-xdist each worker takes its share of the cores for torch's threads (and
the processes it starts inherit it), so N workers do not run N x cores threads. Without a GPU, Triton kernels
run under Triton's CPU interpreter (TRITON_INTERPRET=1 is read when a kernel is defined, so it is set before
anything imports triton: torch.compile does). Multi-rank tests fork their ranks from a server that imported the
suite's heavy modules once (kernels.launch.preload). The decode benchmark's vllm peer never reaches a vLLM
environment beside the suite's (.venv-vllm) unless a test names one (REPRO_VLLM_PYTHON)."""
from __future__ import annotations

import os

import torch

from kernels.launch import preload

# the multi-rank tests' ranks fork from one server per worker that has these imported (kernels.launch)
preload("transformers", "repro.rl.mesh_update", "repro.rl.pp", "repro.parallel.harness", "kernels.transport")

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("REPRO_VLLM_PYTHON", "")

workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if workers > 1:
    share = str(max(1, (os.cpu_count() or 1) // workers))
    os.environ.setdefault("OMP_NUM_THREADS", share)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
