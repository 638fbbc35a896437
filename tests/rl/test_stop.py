"""repro.rl.stop: the first SIGINT/SIGTERM only asks for a stop, a second one stops at once, and the handlers are
the process's own again after the block (the loops that use it: tests/rl/test_lockstep.py)."""
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
