"""TapChannel transports behind one interface (``base.Transport``); ``make_transport(name)`` picks one.

    shm           CPU, colocated: one-sided writes into a shared-memory arena
    host_staging  baseline: device -> pinned host -> shared host memory -> host -> device
    gloo          CPU stand-in for remote sources: tagged isend/irecv on the channel's own group
    cuda_ipc      colocated GPUs: one-sided device copies into the consumer's IPC-exported arena
"""
from __future__ import annotations

from kernels.transport.transports.base import Transport

TRANSPORTS = ("shm", "host_staging", "gloo", "cuda_ipc")


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
    if name == "cuda_ipc":
        from kernels.transport.transports.cuda_ipc import CudaIpcTransport
        return CudaIpcTransport()
    raise ValueError(f"unknown transport {name!r}; expected one of {TRANSPORTS}")
