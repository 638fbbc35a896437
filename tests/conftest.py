"""Test-session settings: under pytest-xdist each worker takes its share of the cores for torch's threads (and
the processes it starts inherit it), so N workers do not run N x cores threads."""
from __future__ import annotations

import os

import torch

workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if workers > 1:
    share = str(max(1, (os.cpu_count() or 1) // workers))
    os.environ.setdefault("OMP_NUM_THREADS", share)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
