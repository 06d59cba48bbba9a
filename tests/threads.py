"""Background threads whose failures fail the test.

An exception (an `assert` included) raised in a plain `threading.Thread` only reaches
pytest as a `PytestUnhandledThreadExceptionWarning`, and a `join(timeout)` whose thread is
still running says nothing. `Background` keeps the thread's return value or exception;
`result()` joins it in the test's own thread and returns that value, re-raises that
exception, or fails if the thread is still running after the timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Background(threading.Thread):
    """`fn(*args, **kwargs)` in a daemon thread, started at once."""

    def __init__(self, fn: Callable[..., Any], *args: Any, name: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(daemon=True, name=name or getattr(fn, "__name__", None))
        self._call = (fn, args, kwargs)
        self.value: Any = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        fn, args, kwargs = self._call
        try:
            self.value = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test by result()
            self.error = exc

    def result(self, timeout: float = 30.0) -> Any:
        """Join; the thread's return value, or its exception raised here."""
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"thread {self.name!r} still running after {timeout}s")
        if self.error is not None:
            raise self.error
        return self.value
