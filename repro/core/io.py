"""Atomic writes: readers never see a half-written file, and a failed write leaves the old file in place.

    write_json_atomic("results/x/bench.json", {"records": [...]})
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write a file so that readers never see it half-written: temp file in the same folder, then rename."""
    mode = "wb" if isinstance(data, bytes) else "w"
    return write_atomic_with(path, lambda f: f.write(data), mode)


def write_atomic_with(path: str | os.PathLike, fill: Callable[[IO], Any], mode: str = "wb") -> Path:
    """``write_atomic`` for a writer that streams into an open file (``torch.save(obj, f)``): ``fill(f)`` writes the
    temp file, which is synced and renamed over ``path`` only if ``fill`` returns; on any failure it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    return write_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
