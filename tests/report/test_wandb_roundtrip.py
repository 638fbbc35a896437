"""A real offline W&B run written by the suite's logger is read back exactly by the suite's reader,
and logs that are truncated, corrupt or from another wandb version are refused with a clear error.

    .venv/bin/python -m pytest -q tests/report/test_wandb_roundtrip.py
"""
import json
import random
import struct
import zlib

import pytest

from repro.core.metrics import MetricsLogger
from repro.core.wandb_reader import WandbLogError, find_wandb_logs, read_wandb_log

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    rng = random.Random(7)
    rows = []
    # ~1500 rows of 6 values: the log spans several 32 KiB blocks, so records cross block boundaries.
    with MetricsLogger(run_dir, artifact="fig5", profile="cpu-tiny", config={"cp": [1, 2], "x": 0.5}) as log:
        for step in range(1500):
            metrics = {f"m{k}": rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-12, 12) for k in range(5)}
            metrics["count"] = step * 3
            row = f"row {step % 7}/cp={step % 3}"
            log.log(metrics, row=row, step=step)
            rows.append({"row": row, "step": step, **metrics})
    return run_dir, rows


def test_history_reads_back_exactly(logged_run):
    run_dir, rows = logged_run
    logs = find_wandb_logs(run_dir)
    assert len(logs) == 1
    assert logs[0].stat().st_size > 3 * 32 * 1024, "log should span several blocks"
    run = read_wandb_log(logs[0])
    assert run.finished and run.exit_code == 0
    assert run.group == "fig5" and run.project
    assert "artifact:fig5" in run.tags and "profile:cpu-tiny" in run.tags
    assert run.config["run_config"] == {"cp": [1, 2], "x": 0.5}
    got = [{k: v for k, v in h.items() if not k.startswith("_")} for h in run.history]
    assert got == rows   # exact: every float bit-identical after the JSON round trip


def test_sidecar_matches_wandb(logged_run):
    run_dir, rows = logged_run
    sidecar = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sidecar == rows


def test_truncated_log_is_refused(logged_run, tmp_path):
    data = find_wandb_logs(logged_run[0])[0].read_bytes()
    # Cut halfway through the payload of the fragment that opens a 32 KiB block from the middle on (every
    # block after the first starts with a fragment header <crc u32, length u16, type u8>). A fixed byte
    # offset could land on a record boundary or in a block's zero trailer, where the file reads as a shorter
    # log; and a block's opening fragment can be a 1-byte tail of a record (the bytes vary with timestamps),
    # so the first block whose opening fragment has 2 or more payload bytes is taken.
    size = 32 * 1024
    starts = range((len(data) // 2) // size * size, len(data) - 7, size)
    block, length = next((b, n) for b in starts if b > 0 and (n := struct.unpack_from("<IHB", data, b)[1]) >= 2)
    cut = tmp_path / "run-cut.wandb"
    cut.write_bytes(data[: block + 7 + length // 2])
    with pytest.raises(WandbLogError, match="truncated"):
        read_wandb_log(cut)


def test_corrupt_log_is_refused(logged_run, tmp_path):
    data = bytearray(find_wandb_logs(logged_run[0])[0].read_bytes())
    data[200] ^= 0xFF
    bad = tmp_path / "run-bad.wandb"
    bad.write_bytes(bytes(data))
    with pytest.raises(WandbLogError, match="checksum|not a wandb Record"):
        read_wandb_log(bad)


def test_not_a_wandb_file(tmp_path):
    p = tmp_path / "run-x.wandb"
    p.write_bytes(b"hello world, not a log")
    with pytest.raises(WandbLogError, match="not a W&B transaction log"):
        read_wandb_log(p)


def _frame(records: list[bytes]) -> bytes:
    out = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, 0))
    for rec in records:   # small records: one FULL fragment each, no block crossing
        out += struct.pack("<IHB", zlib.crc32(bytes([1]) + rec), len(rec), 1) + rec
    return bytes(out)


def test_other_wandb_version_is_refused(tmp_path):
    from wandb.proto import wandb_internal_pb2 as pb
    header = pb.Record()
    header.header.version_info.producer = "0.29.0"
    p = tmp_path / "run-old.wandb"
    p.write_bytes(_frame([header.SerializeToString()]))
    with pytest.raises(WandbLogError, match="written by wandb 0.29.0"):
        read_wandb_log(p)
