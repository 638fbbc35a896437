"""TapChannel protocol on one process (producer and consumer threads over the shm transport):
wrap-around, back-pressure, out-of-order gets, wrong stamps, timeouts, variable length.

    .venv/bin/python -m pytest -q tests/transport/test_protocol.py
"""
import threading
import time

import pytest
import torch

from kernels.transport import (
    ChannelLayout,
    StampMismatchError,
    TapChannel,
    TapChannelError,
    TapSpec,
    TapTimeoutError,
    sequence_stamp,
)

pytestmark = pytest.mark.timeout(60)


def make(depth=2, transport="shm", put_timeout=5.0, get_timeout=5.0):
    layout = ChannelLayout(sources={0: [TapSpec("a", (8, 4))],
                                    1: [TapSpec("b", (8, 4)), TapSpec("c", (8, 2))]},
                           stage_to_rank={0: 0, 1: 0, 2: 0}, consumer_rank=0, ring_depth=depth)
    return TapChannel(layout, transport, rank=0, put_timeout_s=put_timeout, get_timeout_s=get_timeout)


def payload(seq, rows=8, cols=4):
    return torch.arange(rows * cols, dtype=torch.float32).view(rows, cols) + 1000 * seq


@pytest.mark.parametrize("transport", ["shm", "host_staging", "gloo"])
def test_wraparound_bit_exact(transport):
    ch = make(depth=2, transport=transport)
    try:
        for seq in range(7):  # 3.5 times around a ring of 2
            ch.put(1, "b", seq, payload(seq, rows=1 + seq % 8))
            got = ch.get(1, "b", seq)
            assert torch.equal(got, payload(seq, rows=1 + seq % 8))
            ch.put(1, "c", seq, payload(seq, cols=2))
            ch.get(1, "c", seq)
            ch.release(1, seq)
    finally:
        ch.close()


def test_back_pressure_then_progress():
    ch = make(depth=2, put_timeout=10.0)
    try:
        ch.put(0, "a", 0, payload(0))
        ch.put(0, "a", 1, payload(1))
        done = threading.Event()

        def producer():
            ch.put(0, "a", 2, payload(2))  # slot 0 still holds seq 0: must wait for its release
            done.set()

        t = threading.Thread(target=producer)
        t.start()
        time.sleep(0.3)
        assert not done.is_set(), "put overwrote a slot the consumer had not released"
        assert torch.equal(ch.get(0, "a", 0), payload(0))
        ch.release(0, 0)
        t.join(5)
        assert done.is_set()
        assert torch.equal(ch.get(0, "a", 2), payload(2))
    finally:
        ch.close()


def test_back_pressure_times_out_naming_stage_and_seq():
    ch = make(depth=1, put_timeout=0.3)
    try:
        ch.put(0, "a", 0, payload(0))
        t0 = time.monotonic()
        with pytest.raises(TapTimeoutError, match=r"seq 0 of source stage 0 tap 'a'.*seq 1 cannot"):
            ch.put(0, "a", 1, payload(1))
        assert time.monotonic() - t0 < 2.0
    finally:
        ch.close()


def test_out_of_order_gets():
    ch = make(depth=4)
    try:
        for seq in range(4):
            ch.put(0, "a", seq, payload(seq))
        for seq in (3, 1, 0, 2):
            assert torch.equal(ch.get(0, "a", seq), payload(seq))
        for seq in (2, 0, 3, 1):
            ch.release(0, seq)
        ch.put(0, "a", 4, payload(4))
        assert torch.equal(ch.get(0, "a", 4), payload(4))
    finally:
        ch.close()


def test_wrong_stamp_names_source_tap_and_both_stamps():
    ch = make(depth=4)
    try:
        ch.put(0, "a", 5, payload(5))  # the producer thinks it is one step ahead (slot 1)
        with pytest.raises(StampMismatchError,
                           match=r"source stage 0, tap 'a': slot 1 holds seq 5, expected seq 1"):
            ch.get(0, "a", 1)
    finally:
        ch.close()


def test_producer_going_backwards_is_refused():
    ch = make(depth=2)
    try:
        ch.put(0, "a", 2, payload(2))
        with pytest.raises(StampMismatchError, match="seq 0 into slot 0 after seq 2"):
            ch.put(0, "a", 0, payload(0))
    finally:
        ch.close()


def test_consumer_timeout_names_stage_and_seq():
    ch = make(get_timeout=0.2)
    try:
        t0 = time.monotonic()
        with pytest.raises(TapTimeoutError, match=r"source stage 1 \(rank 0\) tap 'b' seq 3"):
            ch.get(1, "b", 3)
        assert time.monotonic() - t0 < 2.0
    finally:
        ch.close()


def test_get_while_slot_unreleased_is_refused():
    ch = make(depth=2)
    try:
        ch.put(0, "a", 0, payload(0))
        ch.get(0, "a", 0)
        with pytest.raises(TapChannelError, match="still holds seq 0"):
            ch.get(0, "a", 2)
    finally:
        ch.close()


def test_bad_inputs_raise_before_any_write():
    ch = make()
    try:
        with pytest.raises(ValueError, match=r"length 9 outside 1..8"):
            ch.put(0, "a", 0, torch.zeros(9, 4))
        with pytest.raises(ValueError, match=r"shape \(2, 5\), expected \(n, 4\)"):
            ch.put(0, "a", 0, torch.zeros(2, 5))
        with pytest.raises(ValueError, match="dtype torch.float64"):
            ch.put(0, "a", 0, torch.zeros(2, 4, dtype=torch.float64))
        with pytest.raises(KeyError, match="no ring for source stage 0, tap 'zz'"):
            ch.put(0, "zz", 0, torch.zeros(2, 4))
    finally:
        ch.close()
    with pytest.raises(ValueError, match="ring_depth=0"):
        ChannelLayout(sources={0: [TapSpec("a", (2,))]}, stage_to_rank={0: 0}, consumer_rank=0, ring_depth=0)
    with pytest.raises(ValueError, match="microbatch=4"):
        sequence_stamp(1, 4, 4)
    assert sequence_stamp(2, 3, 4) == 11


def test_taps_are_detached():
    ch = make()
    try:
        x = torch.ones(2, 4, requires_grad=True) * 3
        ch.put(0, "a", 0, x)
        got = ch.get(0, "a", 0)
        assert not got.requires_grad and torch.equal(got, x.detach())
    finally:
        ch.close()


def test_rank_outside_the_layout_is_a_quiet_member():
    layout = ChannelLayout(sources={0: [TapSpec("a", (2, 2))]}, stage_to_rank={0: 1, 1: 2}, consumer_rank=2,
                           ring_depth=1)
    ch = TapChannel(layout, "cuda_ipc", rank=0)  # rank 0 runs no source and no draft: nothing is opened
    assert not ch.member
    ch.flush()
    ch.close()
    with pytest.raises(TapChannelError, match="after close"):
        ch.put(0, "a", 0, torch.ones(2, 2))
