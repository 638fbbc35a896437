"""The background checkpoint writer: what it writes is the state at save() time, errors reach the training thread,
a failed write leaves the previous checkpoint in place, and tied tensors stay tied."""
from __future__ import annotations

import threading
import time

import pytest
import torch

import repro.rl.checkpoint as ckpt
from repro.rl.checkpoint import CKPT, CheckpointWriter, load_checkpoint

pytestmark = pytest.mark.timeout(60)

CONFIG = {"row": "x", "lr": 1.0}


def _state():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def _held_save(monkeypatch):
    """torch.save as the worker calls it, held until the returned event is set."""
    release, real_save = threading.Event(), torch.save

    def held(obj, f):
        assert release.wait(30), "the test never released the writer"
        real_save(obj, f)
    monkeypatch.setattr(ckpt.torch, "save", held)
    return release


def test_the_checkpoint_holds_the_state_at_save_time_not_what_training_did_next(tmp_path, monkeypatch):
    model, opt = _state()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    expected_moment = opt.state_dict()["state"][0]["exp_avg"].clone()
    release = _held_save(monkeypatch)
    writer = CheckpointWriter(tmp_path)
    writer.save(4, {"policy": model.state_dict(), "optimizer": opt.state_dict()}, CONFIG)
    with torch.no_grad():                                   # training goes on while the write is held
        for p in model.parameters():
            p.add_(1.0)
    opt.state[model.weight]["exp_avg"].mul_(-3.0)
    assert not (tmp_path / CKPT).exists()
    release.set()
    writer.wait()
    state = load_checkpoint(tmp_path, CONFIG)
    assert state["step"] == 4
    for k, v in expected.items():
        assert torch.equal(state["policy"][k], v), k
    assert torch.equal(state["optimizer"]["state"][0]["exp_avg"], expected_moment)
    assert state["optimizer"]["param_groups"][0]["lr"] == 1e-2


def test_a_second_save_waits_for_the_first_and_replaces_it(tmp_path):
    model, opt = _state()
    writer = CheckpointWriter(tmp_path)
    writer.save(1, {"policy": model.state_dict()}, CONFIG)
    with torch.no_grad():
        model.weight.fill_(7.0)
    writer.save(2, {"policy": model.state_dict()}, CONFIG)
    writer.wait()
    state = load_checkpoint(tmp_path, CONFIG)
    assert state["step"] == 2 and torch.all(state["policy"]["weight"] == 7.0)


def test_a_failed_write_raises_on_wait_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model, _ = _state()
    writer = CheckpointWriter(tmp_path)
    writer.save(1, {"policy": model.state_dict()}, CONFIG)
    writer.wait()

    def disk_full(obj, f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(ckpt.torch, "save", disk_full)
    writer.save(2, {"policy": model.state_dict()}, CONFIG)
    with pytest.raises(RuntimeError, match=r"writing checkpoint .*latest.pt failed: .*No space left"):
        writer.wait()
    writer.wait()                                            # raised once; the writer is usable again
    monkeypatch.undo()
    assert load_checkpoint(tmp_path, CONFIG)["step"] == 1
    assert [p.name for p in (tmp_path / CKPT).parent.iterdir()] == ["latest.pt"]   # no temp file left behind


def test_tensors_that_share_memory_are_stored_once_and_load_tied(tmp_path):
    emb = torch.randn(5, 3)
    writer = CheckpointWriter(tmp_path)
    writer.save(0, {"policy": {"embed.weight": emb, "lm_head.weight": emb.detach(), "row": emb[1]}}, CONFIG)
    writer.wait()
    pol = load_checkpoint(tmp_path, CONFIG)["policy"]
    assert pol["embed.weight"].data_ptr() == pol["lm_head.weight"].data_ptr()
    assert torch.equal(pol["row"], emb[1]) and pol["row"].data_ptr() != pol["embed.weight"].data_ptr()


def test_writers_of_one_process_write_one_at_a_time(tmp_path, monkeypatch):
    """Lockstep rows checkpoint at the same step: their writes queue (one old file and one temp file on disk at a
    time), and both land."""
    model, _ = _state()
    entered, release, real_save = [], threading.Event(), torch.save

    def held(obj, f):
        entered.append(obj["step"])
        if obj["step"] == 1:
            assert release.wait(30), "the test never released the writer"
        real_save(obj, f)
    monkeypatch.setattr(ckpt.torch, "save", held)
    first, second = CheckpointWriter(tmp_path / "a"), CheckpointWriter(tmp_path / "b")
    first.save(1, {"policy": model.state_dict()}, CONFIG)
    deadline = time.monotonic() + 30
    while not entered and time.monotonic() < deadline:     # the first write is under way (and held)
        time.sleep(0.01)
    second.save(2, {"policy": model.state_dict()}, CONFIG)
    second._thread.join(0.5)
    assert entered == [1]                      # the second write waits for the first
    release.set()
    first.close()
    second.close()
    assert entered == [1, 2]
    assert load_checkpoint(tmp_path / "a", CONFIG)["step"] == 1 and load_checkpoint(tmp_path / "b", CONFIG)["step"] == 2


def test_wait_for_writes_returns_once_every_writer_of_the_process_landed(tmp_path, monkeypatch):
    """A timed step waits for the writes in flight of every writer (a lockstep process's other rows' too), so no
    write runs beside it; a failed write is left for its own writer to raise."""
    model, _ = _state()
    release = _held_save(monkeypatch)
    a, b = CheckpointWriter(tmp_path / "a"), CheckpointWriter(tmp_path / "b")
    a.save(1, {"policy": model.state_dict()}, CONFIG)
    b.save(2, {"policy": model.state_dict()}, CONFIG)
    waiter = threading.Thread(target=ckpt.wait_for_writes)
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()                       # both writes are held: the wait goes on
    release.set()
    waiter.join(30)
    assert not waiter.is_alive()
    assert not (a._thread.is_alive() or b._thread.is_alive())
    assert load_checkpoint(tmp_path / "a", CONFIG)["step"] == 1 and load_checkpoint(tmp_path / "b", CONFIG)["step"] == 2
    assert ckpt.wait_for_writes() < 1.0            # nothing in flight: returns at once
    a.close()
    b.close()


def test_a_failed_write_is_raised_by_its_writer_not_by_wait_for_writes(tmp_path, monkeypatch):
    model, _ = _state()

    def fail(obj, f):
        raise OSError("No space left on device")
    monkeypatch.setattr(ckpt.torch, "save", fail)
    w = CheckpointWriter(tmp_path)
    w.save(1, {"policy": model.state_dict()}, CONFIG)
    ckpt.wait_for_writes()
    with pytest.raises(RuntimeError, match="No space left"):
        w.close()
