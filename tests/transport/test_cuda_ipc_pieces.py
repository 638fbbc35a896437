"""The CUDA IPC transport's host-side pieces, without a GPU: the arena's ring layout, the layout digest both
sides compare, the handshake (the arena pickled by torch.multiprocessing's reducers, broadcast over the
group and mapped by a source process, here with a CPU arena: the same pickler path a CUDA arena takes),
its refusals, and the stamp protocol (a stamp only after the copy completed, a credit only after the
consumer's reads completed). The CUDA run is kernels/transport/selfcheck_gpu.py.

    .venv/bin/python -m pytest -q tests/transport/test_cuda_ipc_pieces.py
"""
import dataclasses
import threading

import pytest
import torch
import torch.distributed as dist

from kernels.launch import spawn
from kernels.transport import ChannelLayout, TapChannelError, TapSpec
from kernels.transport.control import EMPTY, ControlBlock
from kernels.transport.transports.base import ALIGN, arena_offsets, broadcast_object, layout_digest, slot_view
from kernels.transport.transports.cuda_ipc import CudaIpcTransport, accept_arena, offer_arena

pytestmark = pytest.mark.timeout(90)


def fanin_layout(depth=3, l3_shape=(7, 3), consumer=2, stage_to_rank=None):
    return ChannelLayout(sources={0: [TapSpec("embed", (5, 4)), TapSpec("L1", (5, 4), torch.bfloat16)],
                                  1: [TapSpec("L3", l3_shape, torch.int64)],
                                  2: [TapSpec("L5", (2, 2))]},
                         stage_to_rank=stage_to_rank or {0: 0, 1: 1, 2: 2}, consumer_rank=consumer,
                         ring_depth=depth)


def test_arena_slots_are_aligned_disjoint_and_typed():
    lay = fanin_layout()
    offsets, size = arena_offsets(lay)
    spans = sorted((off, off + lay.rings[i].tap.max_nbytes) for (i, _s), off in offsets.items())
    assert len(spans) == len(lay.rings) * lay.ring_depth
    assert all(a % ALIGN == 0 for a, _ in spans) and spans[-1][1] <= size
    assert all(b0 <= a1 for (_, b0), (a1, _) in zip(spans, spans[1:])), "two slots overlap"
    arena = torch.zeros(size, dtype=torch.uint8)
    for (i, s), off in offsets.items():
        v = slot_view(arena, off, lay.rings[i])
        assert v.shape == lay.rings[i].tap.max_shape and v.dtype == lay.rings[i].tap.dtype
        v.fill_(1 + i * lay.ring_depth + s)
    for (i, s), off in offsets.items():        # every slot kept its own value: no view spills into another
        assert torch.all(slot_view(arena, off, lay.rings[i]) == 1 + i * lay.ring_depth + s)


def test_layout_digest_sees_every_difference_both_sides_derive():
    base = layout_digest(fanin_layout())
    assert layout_digest(fanin_layout()) == base
    for changed in (fanin_layout(depth=2), fanin_layout(l3_shape=(8, 3)), fanin_layout(consumer=0),
                    fanin_layout(stage_to_rank={0: 0, 1: 0, 2: 2}),
                    ChannelLayout(sources={0: [TapSpec("embed", (5, 4))]}, stage_to_rank={0: 0, 1: 1},
                                  consumer_rank=1, ring_depth=3)):
        assert layout_digest(changed) != base


class Gate:
    """A device event the test completes by hand."""

    def __init__(self):
        self._done = threading.Event()

    def synchronize(self):
        assert self._done.wait(10), "gate never opened"

    def open(self):
        self._done.set()


class GatedIpc(CudaIpcTransport):
    """The transport's protocol on the host: copies run at once, their completion is the test's to give."""

    def __init__(self):
        super().__init__()
        self.gates: list[Gate] = []

    def _copy_async(self, dst, src):
        dst.copy_(src)
        self.gates.append(Gate())
        return self.gates[-1]

    def _reads_done(self):
        self.gates.append(Gate())
        return self.gates[-1]


def test_stamp_only_after_the_copy_and_credit_only_after_the_reads():
    lay = ChannelLayout(sources={0: [TapSpec("L1", (4, 2))]}, stage_to_rank={0: 0, 1: 1}, consumer_rank=1,
                        ring_depth=2)
    ring = lay.rings[0]
    arena = torch.zeros(arena_offsets(lay)[1], dtype=torch.uint8)
    ctrl = ControlBlock.private(len(lay.rings), lay.ring_depth)
    src, dst = GatedIpc(), GatedIpc()
    src._attach(lay, 0, torch.device("cpu"), ctrl, arena)
    dst._attach(lay, 1, torch.device("cpu"), ctrl, arena)
    try:
        x = torch.arange(6, dtype=torch.float32).view(3, 2)
        src.publish(ring, 1, x, seq=1, put_ns=123)
        assert dst.poll(ring, 1)[0] == EMPTY, "the stamp showed before the copy completed"
        src.gates[0].open()
        src.flush()
        stamp, length, put_ns, pub_ns = dst.poll(ring, 1)
        assert (stamp, length, put_ns) == (1, 3, 123) and pub_ns > 0
        assert torch.equal(dst.view(ring, 1, length), x)
        dst.release(ring, 1, 1)
        assert src.credit(ring, 1) == EMPTY, "the credit returned before the consumer's reads completed"
        dst.gates[0].open()
        dst.flush()
        assert src.credit(ring, 1) == 1
        with pytest.raises(ValueError, match="carries cpu tensors; tap 'L1' of stage 0 is on meta"):
            src.publish(ring, 0, torch.empty(3, 2, device="meta"), seq=2, put_ns=0)
    finally:
        src.close()
        dst.close()


def handshake_worker(rank, world):
    # CPU storages go to several importers by file name (torch's default passes a file descriptor once)
    torch.multiprocessing.set_sharing_strategy("file_system")
    lay = ChannelLayout(sources={0: [TapSpec("embed", (6, 4)), TapSpec("L1", (6, 4))],
                                 1: [TapSpec("L5", (6, 4))]},
                        stage_to_rank={0: 0, 1: 1}, consumer_rank=1, ring_depth=2)
    offsets, size = arena_offsets(lay)
    out = {}
    offer, arena = None, None
    if rank == 1:
        arena = torch.zeros(size, dtype=torch.uint8)
        offer = offer_arena(arena, "ctrl-name", lay)
    offer = broadcast_object(offer, src=1, group=dist.group.WORLD)
    if rank == 0:
        mapped = accept_arena(offer, lay, 0)
        for r in lay.rings_of_stage(0):
            for s in range(lay.ring_depth):
                slot_view(mapped, offsets[(r.index, s)], r).fill_(10 * r.index + s + 1)
        errors = {}
        other = ChannelLayout(sources=lay.sources, stage_to_rank=lay.stage_to_rank, consumer_rank=1,
                              ring_depth=3)
        elsewhere = dataclasses.replace(offer, device_uuid="GPU-1234")
        for what, call in (("layout", lambda: accept_arena(offer, other, 0)),
                           ("device", lambda: accept_arena(elsewhere, lay, 0)),
                           ("rank", lambda: accept_arena(offer, lay, 7))):
            try:
                call()
                errors[what] = "no error"
            except TapChannelError as exc:
                errors[what] = str(exc)
        out.update(errors=errors, ctrl=offer.ctrl_name, offered_to=sorted(offer.arenas))
        del mapped
    dist.barrier()
    if rank == 1:
        out["slots"] = {(r.index, s): slot_view(arena, offsets[(r.index, s)], r).unique().tolist()
                        for r in lay.rings for s in range(lay.ring_depth)}
    return out


def test_handshake_maps_the_draft_arena_into_a_source_and_refuses_mismatches():
    src, draft = spawn(handshake_worker, 2, timeout_s=60, backend="gloo")
    assert src["offered_to"] == [0] and src["ctrl"] == "ctrl-name"     # the draft's own stage needs no share
    # the source's writes through its own slot views landed in the draft's slots of stage 0; stage 1's stay 0
    assert draft["slots"] == {(0, 0): [1.0], (0, 1): [2.0], (1, 0): [11.0], (1, 1): [12.0], (2, 0): [0.0],
                              (2, 1): [0.0]}
    err = src["errors"]
    assert "different ChannelLayouts" in err["layout"] and "offers an arena of" in err["layout"], err
    assert "allocated on device GPU-1234, but cpu in this process is device cpu" in err["device"], err
    assert "same CUDA_VISIBLE_DEVICES" in err["device"], err
    assert "no share for this rank" in err["rank"] and "source ranks [0]" in err["rank"], err


def test_gpu_selfcheck_plans_cases_by_gpu_count_and_says_why_not(tmp_path, capsys):
    import json

    from kernels.transport import selfcheck_gpu as sc
    runnable = {n: [c.name for c in sc.CASES if c.why_not(n) is None] for n in (0, 1, 2, 4)}
    assert runnable[0] == []
    assert runnable[1] == ["cuda_ipc PP=2", "cuda_ipc PP=4", "cuda_ipc handshake", "host_staging PP=4"]
    assert runnable[2] == runnable[1][:2] + ["cuda_ipc PP=2, draft on its own GPU"] + runnable[1][2:] + \
        ["p2p/NCCL PP=2"]
    assert runnable[4] == [c.name for c in sc.CASES]
    apart = next(c for c in sc.CASES if c.placement == "apart")
    assert apart.gpus(2) == [0, 1]
    assert sc.CASES[1].gpus(1) == [0, 0, 0, 0] and sc.CASES[1].gpus(2) == [0, 1, 0, 1]
    assert "NCCL needs one GPU per rank: PP=4 needs 4 GPUs; 2 here" == sc.CASES[-1].why_not(2)
    if torch.cuda.is_available():
        return
    out = tmp_path / "gpu.json"
    assert sc.main(["--out", str(out)]) == 3                         # nothing could run here: not a pass
    rows = json.loads(out.read_text())["rows"]
    assert [r["verdict"] for r in rows] == ["not run"] * len(sc.CASES) and rows[0]["why"] == "no CUDA device"
    assert "cuda_ipc PP=4" in capsys.readouterr().out
