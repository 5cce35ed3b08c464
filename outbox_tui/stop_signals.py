"""SIGTERM and SIGHUP for the console: quit as ``q`` does, and never hang on the way out.

A stop signal asks the app to quit through its event loop: the in-process dispatcher's
handlers in flight finish and its heartbeat says stopped. The handlers are Python's own
(``signal.signal``), not the event loop's, because the loop may be what is stuck: on a
terminal that went away (SIGHUP), Textual's writer thread dies on the first failed write
and the loop then blocks on its full queue, where a handler registered with the loop
would never run and the process would spin on, unkillable by SIGTERM. So a stop signal
also starts a watchdog that ends the process if the quit has not finished within the
grace period (the lease: by then another dispatcher may take the events over anyway),
and a second stop signal ends it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TextIO

from outbox_tui import PROG

STOP_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGTERM", "SIGHUP")
    if hasattr(signal, name)  # Unix
)
EXIT_NOT_STOPPED = 1


class StopSignals:
    """Catches the stop signals while the console runs; ``received`` names the first one."""

    def __init__(
        self, on_stop: Callable[[], object], *, grace_seconds: float, stderr: TextIO
    ) -> None:
        self.received: str | None = None
        self._on_stop = on_stop
        self._grace = grace_seconds
        self._stderr = stderr
        self._loop: asyncio.AbstractEventLoop | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> None:
        """From the event loop's thread (the main one); elsewhere it does nothing."""
        self._loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            with contextlib.suppress(ValueError):  # not the main thread
                self._previous[sig] = signal.signal(sig, self._signalled)

    def restore(self) -> None:
        """Put back the handlers there were before ``install`` (once the console is gone)."""
        for sig, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, previous)
        self._previous.clear()

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:  # a second stop signal: do not wait any longer
            self._give_up()
        self.received = signal.Signals(signum).name
        watchdog = threading.Timer(self._grace, self._give_up)
        watchdog.daemon = True  # a console that quit in time leaves nothing behind
        watchdog.start()
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the watchdog ends it
                self._loop.call_soon_threadsafe(self._on_stop)

    def _give_up(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # the terminal may be gone
            self._stderr.write(
                f"{PROG}: {self.received} received: the console did not stop within "
                f"{self._grace:g} s; exiting now\n"
            )
            self._stderr.flush()
        os._exit(EXIT_NOT_STOPPED)
