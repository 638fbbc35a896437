"""TapChannel across processes (gloo world, kernels.launch.spawn): PP-1 sources fanning in to the
draft's rank over each CPU transport, bit-exact, with a slow consumer (credits back-pressure the
sources across processes); a producer or consumer that dies mid-run gives a
PeerDiedError naming the rank and sequence number well inside the timeout.

    .venv/bin/python -m pytest -q tests/transport/test_multiprocess.py
"""
import os
import time
import zlib

import pytest
import torch

from kernels.launch import WorkerError, spawn
from kernels.transport import ChannelLayout, PeerDiedError, TapChannel, TapSpec, sequence_stamp

N_MB, STEPS, HIDDEN = 3, 2, 16


def layout(world, depth=2):
    taps = {0: [TapSpec("embed", (24, HIDDEN)), TapSpec("L1", (24, HIDDEN))]}
    for s in range(1, world - 1):
        taps[s] = [TapSpec(f"L{4 * s + 1}", (24, HIDDEN))]
    return ChannelLayout(sources=taps, stage_to_rank={s: s for s in range(world)}, consumer_rank=world - 1,
                         ring_depth=depth)


def tap_value(stage, name, seq):
    g = torch.Generator().manual_seed(zlib.crc32(f"{stage}/{name}/{seq}".encode()))
    rows = 8 + (seq * 5 + stage) % 17  # variable length, always <= 24
    return torch.randn(rows, HIDDEN, generator=g)


def fanin_worker(rank, world, transport, device="cpu"):
    lay = layout(world)
    ch = TapChannel.setup(lay, transport, device=device, get_timeout_s=30, put_timeout_s=30)
    mismatches = 0
    for step in range(STEPS):
        for mb in range(N_MB):
            seq = sequence_stamp(step, mb, N_MB)
            if rank in lay.sources:
                for spec in lay.sources[rank]:
                    ch.put(rank, spec.name, seq, tap_value(rank, spec.name, seq).to(device))
            if rank == lay.consumer_rank:
                time.sleep(0.05)  # a slow consumer: sources two microbatches ahead must wait for credit
                for stage in lay.sources:
                    got = ch.get_stage(stage, seq)
                    for name, t in got.items():
                        mismatches += not torch.equal(t.cpu(), tap_value(stage, name, seq))
                    ch.release(stage, seq)
    rep = ch.report()
    ch.close()
    return {"mismatches": mismatches, "report": rep}


FANIN_CASES = [("shm", "cpu"), ("gloo", "cpu"), ("p2p", "cpu"), ("host_staging", "cpu"),
               pytest.param("cuda_ipc", "cuda", marks=pytest.mark.gpu),
               pytest.param("host_staging", "cuda", marks=pytest.mark.gpu)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport,device", FANIN_CASES)
def test_fanin_bit_exact(transport, device):
    # depth-2 rings over 6 microbatches: every slot is reused (wrap-around, credits)
    out = spawn(fanin_worker, 4, args=(transport, device), timeout_s=100, backend="gloo")
    consumer = out[-1]
    assert consumer["mismatches"] == 0
    assert consumer["report"]["get"]["bytes"]["n"] == STEPS * N_MB * 4  # 4 rings
    for rank, r in enumerate(out[:-1]):
        assert r["report"]["put"]["bytes"]["n"] == STEPS * N_MB * len(layout(4).sources[rank])
        # back-pressure: with depth-2 rings, every source waited for credit behind the slow consumer
        assert r["report"]["put"]["credit_wait_s"]["max"] > 0.01, r["report"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4], ids=["PP=2", "PP=4"])
def test_p2p_over_gloo_fanin_bit_exact(world):
    """The point-to-point transport (one driver thread per rank, pre-posted receives on the draft's rank)
    over gloo at PP=2 and PP=4: every tap bit-exact, slots reused through credits, a slow consumer
    back-pressuring every source."""
    out = spawn(fanin_worker, world, args=("p2p", "cpu"), timeout_s=100, backend="gloo")
    lay = layout(world)
    assert out[-1]["mismatches"] == 0
    assert out[-1]["report"]["get"]["bytes"]["n"] == STEPS * N_MB * len(lay.rings)
    for rank, r in enumerate(out[:-1]):
        assert r["report"]["put"]["bytes"]["n"] == STEPS * N_MB * len(lay.sources[rank])
        assert r["report"]["put"]["credit_wait_s"]["max"] > 0.01, r["report"]


def p2p_order_worker(rank, world):
    lay = layout(world)
    ch = TapChannel.setup(lay, "p2p", get_timeout_s=10, put_timeout_s=10)
    msg = "no error"
    if rank == 0:
        ch.put(0, "embed", 0, tap_value(0, "embed", 0))
        try:
            ch.put(0, "L1", 1, tap_value(0, "L1", 1))      # skips seq 0 of L1
        except Exception as exc:  # noqa: BLE001 - the message is the result
            msg = f"{type(exc).__name__}: {exc}"
    return msg


@pytest.mark.timeout(60)
def test_p2p_refuses_a_skipped_stamp():
    out = spawn(p2p_order_worker, 2, timeout_s=40, backend="gloo")
    assert "StampMismatchError" in out[0] and "put seq 1, expected seq 0" in out[0], out[0]


def death_worker(rank, world, who_dies, result_path):
    lay = ChannelLayout(sources={0: [TapSpec("L1", (4, 4))]}, stage_to_rank={0: 0, 1: 1}, consumer_rank=1,
                        ring_depth=1)
    ch = TapChannel.setup(lay, "shm", get_timeout_s=20, put_timeout_s=20)
    if rank == 0:
        ch.put(0, "L1", 0, torch.ones(4, 4))
        if who_dies == "producer":
            os._exit(3)
        try:  # consumer dies without releasing seq 0: seq 1 can never get credit
            t0 = time.monotonic()
            ch.put(0, "L1", 1, torch.ones(4, 4))
            msg = "no error"
        except PeerDiedError as exc:
            msg = f"{time.monotonic() - t0:.2f} {exc}"
    else:
        ch.get(0, "L1", 0)
        if who_dies == "consumer":
            time.sleep(0.2)
            os._exit(3)
        ch.release(0, 0)
        try:
            t0 = time.monotonic()
            ch.get(0, "L1", 1)
            msg = "no error"
        except PeerDiedError as exc:
            msg = f"{time.monotonic() - t0:.2f} {exc}"
    with open(result_path, "w") as f:
        f.write(msg)
    os._exit(0)  # the peer is gone: no collective teardown is possible


@pytest.mark.timeout(60)
@pytest.mark.parametrize("who_dies", ["producer", "consumer"])
def test_peer_death_is_reported(tmp_path, who_dies):
    path = tmp_path / "msg.txt"
    with pytest.raises(WorkerError):
        spawn(death_worker, 2, args=(who_dies, str(path)), timeout_s=40)
    msg = path.read_text()
    elapsed, _, text = msg.partition(" ")
    assert float(elapsed) < 5.0, msg  # found by the liveness check, long before the 20 s timeout
    if who_dies == "producer":
        assert "rank 0" in text and "has exited" in text, text
        assert "source stage 0" in text and "seq 1" in text, text
    else:
        assert "rank 1" in text and "has exited" in text and "seq 0" in text and "seq 1" in text, text
