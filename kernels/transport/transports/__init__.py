"""TapChannel transports behind one interface (``base.Transport``); ``make_transport(name)`` picks one.

    shm           CPU, colocated: one-sided writes into a shared-memory arena
    host_staging  baseline: device -> pinned host -> shared host memory -> host -> device
    gloo          CPU stand-in for remote sources: tagged isend/irecv on the channel's own group
    p2p           remote sources over torch.distributed point-to-point, gloo (CPU) or NCCL (GPU): pre-posted
                  receives on the draft's rank, one driver thread per rank in one canonical order
    cuda_ipc      colocated GPUs: one-sided device copies into the consumer's arena, shared through
                  torch.multiprocessing's CUDA tensor sharing
"""
from __future__ import annotations

from kernels.transport.transports.base import Transport

TRANSPORTS = ("shm", "host_staging", "gloo", "p2p", "cuda_ipc")


def make_transport(name: str) -> Transport:
    if name == "shm":
        from kernels.transport.transports.shm import SharedMemoryTransport
        return SharedMemoryTransport()
    if name == "host_staging":
        from kernels.transport.transports.shm import HostStagingTransport
        return HostStagingTransport()
    if name == "gloo":
        from kernels.transport.transports.gloo import GlooTransport
        return GlooTransport()
    if name == "p2p":
        from kernels.transport.transports.p2p import P2PTransport
        return P2PTransport()
    if name == "cuda_ipc":
        from kernels.transport.transports.cuda_ipc import CudaIpcTransport
        return CudaIpcTransport()
    raise ValueError(f"unknown transport {name!r}; expected one of {TRANSPORTS}")
