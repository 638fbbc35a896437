"""A small reader of W&B offline transaction logs (``run-<id>.wandb``), pinned to wandb 0.31.x.

W&B removed its own reader (``DataStore``) in 0.30; offline, the ``.wandb`` file is the only record
of a run. The format: a 7-byte file header (``:W&B``, magic 0xBEE1 little-endian, version 0), then
32 KiB blocks of fragments, each with a 7-byte header (crc32 of type byte + payload, u16 length,
u8 type FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4); reassembled fragments are protobuf ``Record``s of
``wandb.proto.wandb_internal_pb2``. The first record's ``header.version_info.producer`` names the
wandb version that wrote the file; other versions are refused rather than misread.

    python -m repro.core.wandb_reader results/.../wandb/offline-run-*/run-*.wandb   # dump history
"""
from __future__ import annotations

import json
import struct
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

SUPPORTED_PRODUCERS = ("0.31.",)   # tested by tests/report/test_wandb_roundtrip.py with wandb 0.31.0
_FILE_HEADER = struct.Struct("<4sHB")
_FRAG_HEADER = struct.Struct("<IHB")
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


class WandbLogError(ValueError):
    """The file is not a W&B log this reader supports, or it is truncated/corrupt."""


@dataclass
class WandbRun:
    path: Path
    producer: str
    run_id: str = ""
    project: str = ""
    group: str = ""
    job_type: str = ""
    name: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    finished: bool = False
    exit_code: int | None = None
    start_time: float = 0.0     # seconds since the epoch, from the run record


def _records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    if len(data) < _FILE_HEADER.size:
        raise WandbLogError(f"{path}: {len(data)} bytes, too short for a W&B log header "
                            "(truncated, or not a .wandb file)")
    ident, magic, version = _FILE_HEADER.unpack_from(data)
    if ident != b":W&B" or magic != 0xBEE1:
        raise WandbLogError(f"{path}: not a W&B transaction log (header {data[:7]!r}, expected ':W&B' + 0xBEE1)")
    if version != 0:
        raise WandbLogError(f"{path}: W&B log format version {version}, this reader supports version 0")
    pos, pending = _FILE_HEADER.size, bytearray()
    in_record = False
    while pos < len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _FRAG_HEADER.size:   # block trailer: zero padding
            pos += left
            continue
        if len(data) - pos < _FRAG_HEADER.size:
            raise WandbLogError(f"{path}: truncated inside a fragment header at byte {pos}")
        crc, length, ftype = _FRAG_HEADER.unpack_from(data, pos)
        if crc == 0 and length == 0 and ftype == 0:   # zero padding to the end of a block
            pos += left
            continue
        start, end = pos + _FRAG_HEADER.size, pos + _FRAG_HEADER.size + length
        if end > len(data):
            raise WandbLogError(f"{path}: truncated: a {length}-byte fragment at byte {pos} runs past "
                                f"the end of the file ({len(data)} bytes)")
        payload = data[start:end]
        if zlib.crc32(bytes([ftype]) + payload) != crc:
            raise WandbLogError(f"{path}: checksum mismatch in the fragment at byte {pos} (corrupt file)")
        pos = end
        if ftype == _FULL and not in_record:
            yield bytes(payload)
        elif ftype == _FIRST and not in_record:
            pending, in_record = bytearray(payload), True
        elif ftype == _MIDDLE and in_record:
            pending += payload
        elif ftype == _LAST and in_record:
            pending += payload
            in_record = False
            yield bytes(pending)
        else:
            raise WandbLogError(f"{path}: fragment of type {ftype} out of order at byte {pos}")
    if in_record:
        raise WandbLogError(f"{path}: truncated: the last record is incomplete")


def _key(item) -> str:
    return "/".join(item.nested_key) if len(item.nested_key) else item.key


def read_wandb_log(path: str | Path) -> WandbRun:
    """Parse one offline ``.wandb`` file into its run metadata, config, history rows and summary."""
    from wandb.proto import wandb_internal_pb2 as pb

    path = Path(path)
    run: WandbRun | None = None
    for i, raw in enumerate(_records(path)):
        rec = pb.Record()
        try:
            rec.ParseFromString(raw)
        except Exception as exc:  # protobuf's DecodeError
            raise WandbLogError(f"{path}: record {i} is not a wandb Record ({exc})") from exc
        kind = rec.WhichOneof("record_type")
        if run is None:
            if kind != "header":
                raise WandbLogError(f"{path}: first record is {kind!r}, expected the header")
            producer = rec.header.version_info.producer
            if not producer.startswith(SUPPORTED_PRODUCERS):
                raise WandbLogError(f"{path}: written by wandb {producer or 'unknown'}, this reader is "
                                    f"tested with wandb {', '.join(p + 'x' for p in SUPPORTED_PRODUCERS)}")
            run = WandbRun(path=path, producer=producer)
            continue
        if kind == "run":
            r = rec.run
            run.run_id, run.project, run.group = r.run_id, r.project, r.run_group
            run.job_type, run.name, run.tags = r.job_type, r.display_name, list(r.tags)
            run.start_time = r.start_time.seconds + r.start_time.nanos / 1e9
            for item in r.config.update:
                run.config[_key(item)] = json.loads(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                run.config[_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            run.history.append({_key(it): json.loads(it.value_json) for it in rec.history.item})
        elif kind == "summary":
            for item in rec.summary.update:
                run.summary[_key(item)] = json.loads(item.value_json)
        elif kind == "exit":
            run.finished, run.exit_code = True, rec.exit.exit_code
    if run is None:
        raise WandbLogError(f"{path}: no records (empty log)")
    return run


def find_wandb_logs(run_dir: str | Path) -> list[Path]:
    """The ``run-*.wandb`` files under a run folder, oldest first: the suite's layout
    (``wandb/offline-run-*/``) and NeMo-RL's, which passes its own ``dir=`` to wandb.init
    (``<logger.log_dir>/exp_NNN/wandb/wandb/offline-run-*/``, one folder below the run folder)."""
    run_dir = Path(run_dir)
    return sorted({*run_dir.glob("wandb/*run-*/run-*.wandb"),
                   *run_dir.glob("*/exp_*/wandb/wandb/*run-*/run-*.wandb")})


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        run = read_wandb_log(arg)
        print(json.dumps({"run_id": run.run_id, "project": run.project, "group": run.group,
                          "tags": run.tags, "finished": run.finished}, indent=1))
        for row in run.history:
            print(json.dumps(row))
