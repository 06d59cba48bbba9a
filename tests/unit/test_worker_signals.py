"""The threaded worker's signal handlers (disque.worker.threads.stop_on_signals)."""

from __future__ import annotations

import signal
import threading

from disque.worker.threads import stop_on_signals


def test_a_signal_during_the_stop_of_another_waits_for_it_instead_of_reentering() -> None:
    # A second SIGTERM while the first stop held the driver's (or the log's) lock ran the
    # handler again inside it, in the same thread: it waited for its own lock and the
    # worker hung instead of exiting forced (test_second_signal_forces_the_exit, in CI)
    lock = threading.Lock()  # not reentrant, as the driver's
    calls: list[str] = []

    def on_stop(reason: str) -> None:
        assert lock.acquire(timeout=2), "the handler ran inside itself"
        try:
            calls.append(reason)
            if len(calls) == 1:
                signal.raise_signal(signal.SIGTERM)  # runs its handler before this returns
                calls.append("first done")
        finally:
            lock.release()

    restore = stop_on_signals(on_stop)
    try:
        signal.raise_signal(signal.SIGINT)
    finally:
        restore()
    assert calls == ["SIGINT", "first done", "SIGTERM"]


def test_the_previous_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    restore = stop_on_signals(lambda reason: None)
    assert signal.getsignal(signal.SIGTERM) is not before[0]
    restore()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
