"""The one place where failures become one line on stderr (and, with ``--json``, an
``{"error", "exit_status"}`` object on stdout) and an exit status."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable

from engine.errors import ConfigurationError, OutboxError
from outbox_tui.output import Output

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

log = logging.getLogger("outbox_tui.cli")


class UsageError(Exception):
    """The command line is wrong (exit status 2)."""


def exit_status(exc: OutboxError) -> int:
    """2 when the invocation or configuration must change, 1 when something failed."""
    return EXIT_USAGE if isinstance(exc, ConfigurationError) else EXIT_FAILURE


def _silence_stdout() -> None:
    """The reader went away (``| head``): later writes and the final flush go nowhere."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _closed_pipe(exc: BaseException) -> bool:
    """A write to stdout failed inside a database block, which reports it as a storage error."""
    cause = exc.__cause__ or exc.__context__
    return isinstance(cause, BrokenPipeError)


def run_guarded(body: Callable[[], int], out: Output) -> int:
    """Run a command; every failure is one line on ``out``'s stderr and an exit status."""
    try:
        return body()
    except UsageError as exc:
        return out.failed(str(exc), EXIT_USAGE)
    except OutboxError as exc:
        if _closed_pipe(exc):
            _silence_stdout()
            return EXIT_OK
        return out.failed(str(exc) or type(exc).__name__, exit_status(exc))
    except BrokenPipeError:
        _silence_stdout()  # like other Unix tools: no message when the pipe closes
        return EXIT_OK
    except KeyboardInterrupt:
        return out.failed("interrupted", EXIT_INTERRUPTED)
    except Exception as exc:  # a bug: one line for the operator, the traceback at DEBUG
        log.debug("unexpected error", exc_info=True)
        return out.failed(
            f"unexpected {type(exc).__name__}: {exc} (run with --log-level DEBUG for details)",
            EXIT_FAILURE,
        )
