"""kernels.launch.spawn: results in rank order, a failing rank re-raised with its traceback, and a
deadlocked group killed at the timeout instead of hanging the test suite.

    .venv/bin/python -m pytest -q tests/launch
"""
import time

import pytest
import torch
import torch.distributed as dist

from kernels.launch import WorkerError, spawn

pytestmark = pytest.mark.timeout(120)


def _allreduce(rank, world):
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    return (rank, world, t.item(), torch.get_num_threads())


def _fail_on_rank_1(rank, world):
    if rank == 1:
        raise ValueError("bad shard on purpose")
    return rank


def _hang_on_rank_0(rank, world):
    if rank == 0:
        time.sleep(600)
    return rank


def test_results_in_rank_order():
    out = spawn(_allreduce, 3, timeout_s=60)
    assert out == [(r, 3, 6.0, 1) for r in range(3)]


def test_worker_error_names_rank_and_traceback():
    with pytest.raises(WorkerError, match=r"rank 1: ValueError: bad shard on purpose(.|\n)*_fail_on_rank_1"):
        spawn(_fail_on_rank_1, 2, timeout_s=60)


def test_timeout_kills_hung_ranks():
    t0 = time.monotonic()
    # Rank 1 may still be starting up on a loaded machine, so it can be listed too.
    with pytest.raises(TimeoutError, match=r"ranks \[0(, 1)?\] of 2 still running after 8 s"):
        spawn(_hang_on_rank_0, 2, timeout_s=8)
    assert time.monotonic() - t0 < 60
