"""What a stop signal does once the collection's stop began: counted, not obeyed at
once (kernmlops.collect.attach decides: the first Ctrl+C is said, the second leaves
the rest of the spool)."""

from __future__ import annotations

import os
import signal

from kernmlops.collect.loop import StopSignals


def test_signals_in_the_stop_are_counted_a_sigterm_as_two() -> None:
    stop = StopSignals()
    old = stop.install()
    try:
        stop.stopping()  # the loop ended by itself: no signal yet
        assert stop.asked_in_stop() == 0 and stop.signal is None
        os.kill(os.getpid(), signal.SIGINT)  # handled before kill returns (this thread)
        assert stop.asked_in_stop() == 1 and stop.signal == signal.SIGINT
        os.kill(os.getpid(), signal.SIGTERM)  # a service manager asks once
        assert stop.asked_in_stop() == 3
        assert stop.signal == signal.SIGINT  # the exit code: the first one's
    finally:
        StopSignals.restore(old)


def test_a_signal_before_the_stop_is_not_counted_in_it() -> None:
    stop = StopSignals()
    old = stop.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)  # the Ctrl+C that ended the run
        assert stop.signal == signal.SIGINT
        stop.stopping()
        assert stop.asked_in_stop() == 0
    finally:
        StopSignals.restore(old)
