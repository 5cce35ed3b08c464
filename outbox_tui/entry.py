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


def _terminate(signum: int, frame: Any) -> None:
    raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        from outbox_tui.cli import main as cli_main

        return cli_main(argv)
    except _Terminated:
        sys.stderr.write(f"{PROG}: SIGTERM received during start-up: stopped\n")
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
