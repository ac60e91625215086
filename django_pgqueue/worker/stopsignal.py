"""SIGTERM and SIGINT, acted on outside the signal handler.

Python runs a signal handler in the main thread, between two bytecodes, possibly while
that thread holds a lock. A handler that takes the same lock waits for itself forever:
``threading.Event.set()`` from a handler hangs if the signal lands while the main thread
is inside ``wait()`` or ``clear()`` of that event (its condition's lock is not
reentrant). The worker's loop waits on such an event all the time, so a stop signal
could leave the process hung, its scheduler and heartbeat threads still running (the
``signal`` module's documentation warns against locks in handlers).

So the handler installed here only writes the signal's number to a pipe, which takes no
lock. A relay thread reads the pipe and calls the callback, which may then take any lock
like any other thread's code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType
from typing import Any

__all__ = ["STOP_SIGNALS", "SignalRelay"]

logger = logging.getLogger("django_pgqueue.worker")

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)

#: Not a signal number: written by :meth:`SignalRelay.__exit__` to end the relay thread.
_CLOSE = 0


class SignalRelay:
    """While entered, call ``callback(signum)`` from a relay thread for each stop signal.

    Enter it in the main thread (only that thread may install handlers). Each signal
    received is relayed once, in order, so a second SIGTERM is seen as a second request.
    On exit the previous handlers come back, and signals not yet relayed are relayed
    before the thread ends.
    """

    def __init__(
        self,
        callback: Callable[[int], None],
        *,
        signals: Sequence[int] = STOP_SIGNALS,
        name: str = "pgqueue-signals",
    ) -> None:
        self._callback = callback
        self._signals = tuple(signals)
        self._name = name
        self._previous: dict[int, Any] = {}
        self._read_fd = -1
        self._write_fd = -1
        self._thread: threading.Thread | None = None

    def __enter__(self) -> SignalRelay:
        self._read_fd, self._write_fd = os.pipe()
        # Never block the main thread: a full pipe already holds plenty of requests.
        os.set_blocking(self._write_fd, False)
        write_fd = self._write_fd

        def handler(signum: int, frame: FrameType | None) -> None:
            # Full (plenty of requests wait already) or closed (the relay has ended and
            # someone reinstalled this handler): nothing a handler could do better.
            with contextlib.suppress(OSError):
                os.write(write_fd, bytes((signum,)))

        try:
            for sig in self._signals:
                self._previous[sig] = signal.signal(sig, handler)
        except BaseException:  # not the main thread, say: leave nothing behind
            self._restore()
            os.close(self._read_fd)
            os.close(self._write_fd)
            raise
        # Signals received before the thread runs wait in the pipe.
        self._thread = threading.Thread(target=self._relay, name=self._name, daemon=True)
        self._thread.start()
        return self

    def _restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._restore()
        # A blocking write: the relay thread is reading, so it cannot wait long.
        os.set_blocking(self._write_fd, True)
        os.write(self._write_fd, bytes((_CLOSE,)))
        if self._thread is not None:
            self._thread.join(5)
        os.close(self._write_fd)
        if self._thread is None or not self._thread.is_alive():
            os.close(self._read_fd)

    def _relay(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:  # closed under us: nothing more can arrive
                return
            for signum in data:
                if signum == _CLOSE:
                    return
                try:
                    self._callback(signum)
                except Exception:
                    logger.exception("handling signal %s failed", signum)
