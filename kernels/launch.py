"""Run a function on N ranks of a fresh torch.distributed group: gloo on CPU, NCCL on GPUs.

Used by the multi-rank tests and the CPU (cpu-emulated) benchmarks. Each rank is a fresh process (forked from a
server that imported torch and the function's module once where there is no GPU, spawned where there is). Workers
rendezvous through a ``file://`` store in a private temp folder (no port races), run with one intra-op thread each,
and are killed when the hard timeout passes, so a deadlocked collective fails a test instead of hanging.
Each worker's return value (anything picklable) comes back in rank order; an exception in any
worker is re-raised in the parent with that worker's traceback.

    from kernels.launch import spawn
    results = spawn(my_fn, world_size=4, args=(cfg,), timeout_s=120)   # my_fn(rank, world, *args)

Under torchrun (GPU clusters) use ``init_from_env()`` instead.
"""
from __future__ import annotations

import os
import pickle
import tempfile
import time
import traceback
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class WorkerError(RuntimeError):
    """A worker raised; the message carries its rank and traceback."""


def _worker(rank: int, world_size: int, init_file: str, out_dir: str, backend: str, threads: int) -> None:
    torch.set_num_threads(threads)
    result_path = os.path.join(out_dir, f"rank{rank}.pkl")
    try:
        with open(os.path.join(out_dir, "call.pkl"), "rb") as f:
            fn, args = pickle.load(f)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                                world_size=world_size)
        # Finish gloo's full-mesh connect on every rank before user code can fail and tear it down.
        dist.barrier()
        try:
            value = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        payload = ("ok", value)
    except BaseException as exc:  # report everything, including KeyboardInterrupt from the parent
        payload = ("error", f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    with open(result_path + ".tmp", "wb") as f:
        pickle.dump(payload, f)
    os.replace(result_path + ".tmp", result_path)


_PRELOAD: list[str] = ["torch", "torch.distributed"]


def preload(*modules: str) -> None:
    """Modules the rank server imports once, besides torch and the first spawned function's module (a test session
    names the suite's heavy modules, so that ranks of every later function start without importing them). Takes
    effect only before the first ``spawn`` of the process."""
    _PRELOAD.extend(m for m in modules if m not in _PRELOAD)


def _context(fn: Callable):
    """Where no GPU exists, ranks fork from a server that imported torch, the ``preload`` modules and the first
    function's module once (with their own imports: transformers, the suite): a rank starts in well under a second
    instead of importing them again. With a GPU they spawn afresh, since a CUDA driver touched before a fork cannot
    serve the child."""
    if torch.cuda.is_available() or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([*_PRELOAD, fn.__module__])     # read when the server first starts
    return ctx


def spawn(fn: Callable, world_size: int, args: Sequence[Any] = (), *, timeout_s: float = 120.0,
          backend: str | None = None, threads_per_rank: int = 1) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` fresh processes and return their results.

    ``fn`` must be importable (defined at module top level). Raises ``WorkerError`` on the first
    failing rank, ``TimeoutError`` naming the ranks still running after ``timeout_s``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    backend = backend or ("nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size
                          else "gloo")
    with tempfile.TemporaryDirectory(prefix="repro-dist-") as tmp:
        init_file = os.path.join(tmp, "store")
        # The call travels as a plain pickle (each rank a copy of the arguments), not as process arguments: those
        # would pass every tensor's shared memory as a file descriptor, of which a forkserver takes at most 256.
        with open(os.path.join(tmp, "call.pkl"), "wb") as f:
            pickle.dump((fn, tuple(args)), f)
        ctx = _context(fn)
        procs = [ctx.Process(target=_worker, daemon=True,
                             args=(r, world_size, init_file, tmp, backend, threads_per_rank))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        try:
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
            alive = [r for r, p in enumerate(procs) if p.is_alive()]
            results: list[Any] = []
            errors: list[str] = []
            for r, p in enumerate(procs):
                path = os.path.join(tmp, f"rank{r}.pkl")
                if not os.path.exists(path):
                    if r not in alive:
                        errors.append(f"rank {r}: exited with code {p.exitcode} without a result")
                    results.append(None)
                    continue
                with open(path, "rb") as f:
                    status, value = pickle.load(f)
                if status == "error":
                    errors.append(value)
                results.append(value)
            if errors:
                raise WorkerError("\n".join(errors))
            if alive:
                raise TimeoutError(f"ranks {alive} of {world_size} still running after {timeout_s:.0f} s "
                                   "(deadlock or a missed collective?)")
            return results
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(5)


def init_from_env(backend: str | None = None) -> tuple[int, int]:
    """Initialise from torchrun's environment; returns (rank, world_size)."""
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()
