"""repro.rl.stop: the first SIGINT/SIGTERM only asks for a stop, a second one stops at once, and the handlers are
the process's own again after the block, and a repeat inside ``same_within_s`` is the first one delivered again (the
loops that use it: tests/rl/test_lockstep.py, tests/rl/test_dist_run.py)."""
import signal

import pytest

from repro.rl.stop import StopOnSignal


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_first_signal_asks_second_stops_at_once(signum, capfd):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(KeyboardInterrupt):
        with StopOnSignal("test") as stop:
            assert not stop.requested
            signal.raise_signal(signum)              # handled: nothing raised, the loop goes on
            assert stop.requested and stop.exit_code == 128 + signum
            assert f"test: {signal.Signals(signum).name}: stopping after the step in flight" in capfd.readouterr().err
            signal.raise_signal(signum)              # the second: at once
    assert {s: signal.getsignal(s) for s in before} == before


def test_handlers_are_restored_after_a_quiet_block():
    before = signal.getsignal(signal.SIGINT)
    with StopOnSignal("test") as stop:
        assert signal.getsignal(signal.SIGINT) is not before
    assert not stop.requested and signal.getsignal(signal.SIGINT) is before


def test_a_signal_delivered_again_within_the_window_is_the_same_request(monkeypatch):
    """Under torchrun a Ctrl-C reaches a worker twice (the terminal's group, the launcher forwarding it): with
    same_within_s the repeat inside the window is the same request; after it, a second signal stops at once."""
    from repro.rl import stop as stop_module
    clock = [100.0]
    monkeypatch.setattr(stop_module.time, "monotonic", lambda: clock[0])
    with pytest.raises(KeyboardInterrupt):
        with StopOnSignal("test", same_within_s=2.0) as stop:
            signal.raise_signal(signal.SIGINT)
            clock[0] += 1.5
            signal.raise_signal(signal.SIGINT)       # forwarded copy of the first: still only a request
            assert stop.requested and stop.exit_code == 128 + signal.SIGINT
            clock[0] += 1.0
            signal.raise_signal(signal.SIGINT)       # 2.5 s after the first: a second signal
