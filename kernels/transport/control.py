"""The control words of every ring slot and the small helpers around them.

Each (ring, slot) has five int64 words: ``STAMP`` (sequence number of the payload in the slot),
``LENGTH`` (valid rows of dim 0), ``PUT_NS`` (producer clock when put() was called), ``PUBLISH_NS``
(when the payload became visible), ``CREDIT`` (last sequence number the consumer released). The
producer writes LENGTH, PUT_NS and PUBLISH_NS *before* STAMP; the consumer reads STAMP first. Clocks
are ``time.monotonic_ns()`` (system-wide on Linux, so comparable between processes of one host).

``ControlBlock`` keeps the words either in POSIX shared memory (colocated transports) or in private
memory (the gloo transport mirrors them from messages).
"""
from __future__ import annotations

import os
from multiprocessing import resource_tracker, shared_memory

import numpy as np

STAMP, LENGTH, PUT_NS, PUBLISH_NS, CREDIT = range(5)
N_WORDS = 5
EMPTY = -(2 ** 62)  # a slot never written / never released


class ControlBlock:
    """int64 words ``[n_rings, depth, N_WORDS]``, initialised to EMPTY by the creator."""

    def __init__(self, words: np.ndarray, shm: shared_memory.SharedMemory | None, owner: bool):
        self.words, self._shm, self._owner = words, shm, owner

    @staticmethod
    def nbytes(n_rings: int, depth: int) -> int:
        return n_rings * depth * N_WORDS * 8

    @classmethod
    def private(cls, n_rings: int, depth: int) -> ControlBlock:
        words = np.full((n_rings, depth, N_WORDS), EMPTY, dtype=np.int64)
        return cls(words, None, owner=True)

    @classmethod
    def create_shared(cls, n_rings: int, depth: int) -> ControlBlock:
        shm = shared_memory.SharedMemory(create=True, size=cls.nbytes(n_rings, depth))
        words = np.ndarray((n_rings, depth, N_WORDS), dtype=np.int64, buffer=shm.buf)
        words[...] = EMPTY
        return cls(words, shm, owner=True)

    @classmethod
    def attach_shared(cls, name: str, n_rings: int, depth: int) -> ControlBlock:
        shm = attach_shm(name)
        words = np.ndarray((n_rings, depth, N_WORDS), dtype=np.int64, buffer=shm.buf)
        return cls(words, shm, owner=False)

    @property
    def name(self) -> str | None:
        return self._shm.name if self._shm is not None else None

    def close(self) -> None:
        self.words = None
        if self._shm is not None:
            close_shm(self._shm, unlink=self._owner)
            self._shm = None


def attach_shm(name: str) -> shared_memory.SharedMemory:
    """Attach to a segment another process created without registering it with this process's
    resource tracker: the creator owns (and unlinks) it, whether or not the trackers are shared."""
    try:
        return shared_memory.SharedMemory(name=name, track=False)  # Python >= 3.13
    except TypeError:
        pass
    register = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None
    try:
        return shared_memory.SharedMemory(name=name)
    finally:
        resource_tracker.register = register


def close_shm(shm: shared_memory.SharedMemory, unlink: bool) -> None:
    try:
        shm.close()
    except BufferError:
        pass  # a caller still holds a view; the mapping goes away with the process
    if unlink:
        try:
            shm.unlink()
        except FileNotFoundError:
            pass


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` of this host exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True
