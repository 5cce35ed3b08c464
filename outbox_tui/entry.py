"""The ``outbox-tui`` script and ``python -m outbox_tui``: SIGTERM is handled from the first
moment, so a stop during the seconds of imports and start-up exits cleanly (0, one line)
instead of killing the process with no summary. Kept free of heavy imports on purpose."""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from typing import Any

from outbox_tui import PROG


class _Terminated(BaseException):
    """SIGTERM arrived before the command installed its own handlers."""


_received = False


def _terminate(signum: int, frame: Any) -> None:
    global _received
    _received = True
    raise _Terminated


def terminated_during_start_up() -> bool:
    """Whether SIGTERM came before the command's own handlers. Its exception is lost when
    Python raised it inside a ``__del__`` or a callback (garbage collection runs during
    imports): the command asks this once its handlers are in place."""
    return _received


def _unraisable(hook: Any) -> Any:
    def quiet(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, _Terminated):  # no traceback for a stop
            hook(unraisable)

    return quiet


def main(argv: Sequence[str] | None = None) -> int:
    previous = signal.signal(signal.SIGTERM, _terminate)
    sys.unraisablehook = _unraisable(sys.unraisablehook)
    try:
        from outbox_tui.cli import main as cli_main

        return cli_main(argv)
    except _Terminated:
        sys.stderr.write(f"{PROG}: SIGTERM received during start-up: stopped\n")
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
