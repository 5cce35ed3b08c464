"""The ``outbox-tui`` script and ``python -m outbox_tui``: SIGTERM is handled from the first
moment, so a stop during the seconds of imports and start-up exits cleanly (0, one line)
instead of killing the process with no summary. Kept free of heavy imports on purpose."""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from typing import Any

from outbox_tui import PROG


class Terminated(BaseException):
    """SIGTERM stopped the command (one without handlers of its own for it)."""


_received = False


def _record(signum: int, frame: Any) -> None:
    global _received
    _received = True


def _terminate(signum: int, frame: Any) -> None:
    _record(signum, frame)
    raise Terminated


def record_sigterm_only() -> Any:
    """From now on SIGTERM is only recorded (``terminated_during_start_up``); returns the
    handler it replaced.

    For the time an event loop runs: an exception raised by a Python signal handler
    inside the loop's own machinery is lost (printed, the run goes on) or leaves the loop
    unable to close. The loop's handler acts on the signal instead
    (``outbox_tui.cli.event_loop``), and asks this flag for one that came before it.
    """
    return signal.signal(signal.SIGTERM, _record)


def terminated_during_start_up() -> bool:
    """Whether SIGTERM came before the command's own handlers. Its exception is lost when
    Python raised it inside a ``__del__`` or a callback (garbage collection runs during
    imports): the command asks this once its handlers are in place."""
    return _received


def _unraisable(hook: Any) -> Any:
    def quiet(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, Terminated):  # no traceback for a stop
            hook(unraisable)

    return quiet


def main(argv: Sequence[str] | None = None) -> int:
    previous = signal.signal(signal.SIGTERM, _terminate)
    sys.unraisablehook = _unraisable(sys.unraisablehook)
    try:
        from outbox_tui.cli import main as cli_main

        return cli_main(argv)
    except Terminated:
        sys.stderr.write(f"{PROG}: SIGTERM received: stopped\n")
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
