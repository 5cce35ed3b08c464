"""Where the command line writes: results on stdout (JSON or rich), the rest on stderr.

Errors are exactly one plain line: rich never wraps or decorates them, so scripts can
match ``outbox-tui: error: ...``. A closed pipe (``| head -1``) ends the command quietly.
"""

from __future__ import annotations

import errno
import json
import sys
from datetime import datetime
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from outbox_tui import PROG
from outbox_tui.output.values import iso
from outbox_tui.safe_text import printable


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def _width(stream: TextIO) -> int | None:
    """Let rich measure a terminal; give anything else room for a whole table row."""
    try:
        return None if stream.isatty() else 200
    except (AttributeError, ValueError):
        return 200


def _one_line(message: object) -> str:
    """An error message as the one line both the stderr line and the JSON object carry."""
    return printable(" ".join(str(message).split()))


class PipeConsole(Console):
    """A rich console that lets a closed pipe end the command like other Unix tools.

    rich's own ``on_broken_pipe`` raises ``SystemExit(1)``; this raises the
    ``BrokenPipeError`` instead, which ``outbox_tui.cli.errors.run_guarded`` turns into
    a quiet exit 0 (``outbox-tui stats | head -1``).
    """

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more from this console (a Live's last refresh, say)
        raise BrokenPipeError(errno.EPIPE, "the reader closed the pipe")


class Output:
    """stdout for results (JSON or rich), stderr for errors, progress and status."""

    def __init__(
        self, *, json_mode: bool, stdout: TextIO | None = None, stderr: TextIO | None = None
    ) -> None:
        self.json_mode = json_mode
        self._stdout = stdout or sys.stdout
        self._stderr = stderr or sys.stderr
        # Piped or redirected output keeps one row per line instead of rich's 80 columns.
        # markup=False: what is printed is data (ids, types, error messages chosen by
        # producers); read as markup, ``[/x]`` in one of them raised MarkupError.
        self.console = PipeConsole(
            file=self._stdout, highlight=False, markup=False, width=_width(self._stdout)
        )
        self.err_console = PipeConsole(
            file=self._stderr, highlight=False, markup=False, width=_width(self._stderr)
        )

    @property
    def stderr(self) -> TextIO:
        return self._stderr

    def json(self, record: Any) -> None:
        """One compact JSON value on one line, flushed at once (for pipes and tests)."""
        self._stdout.write(json.dumps(record, default=_json_default, sort_keys=False) + "\n")
        self._stdout.flush()

    def error(self, message: str) -> None:
        """``outbox-tui: error: <message>`` as one line on stderr, no markup."""
        self._stderr.write(f"{PROG}: error: {_one_line(message)}\n")
        self._stderr.flush()

    def failed(self, message: str, status: int) -> int:
        """A command's failure: the ``error`` line, and in JSON mode also
        ``{"error": ..., "exit_status": N}`` on stdout, so a script that reads stdout
        learns why there is no result. Returns ``status``, the command's exit status."""
        self.error(message)
        if self.json_mode:
            self.json({"error": _one_line(message), "exit_status": status})
        return status

    def note(self, message: str) -> None:
        """A short human remark on stderr (never in JSON mode's stdout)."""
        self.err_console.print(Text(printable(message), style="dim"), soft_wrap=True)

    def say(self, message: str) -> None:
        """A one-line human result on stdout (text mode)."""
        self.console.print(Text(printable(message)), soft_wrap=True)
