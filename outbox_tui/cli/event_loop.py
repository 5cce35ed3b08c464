"""The event loop every async command runs on: uvloop where it is installed.

A dispatcher's Python cost per event is partly the event loop's own: scheduling
callbacks, socket reads and writes for every round trip, which uvloop makes cheaper (see
decision 0023). On Windows (no uvloop) asyncio's loop runs the same code.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from outbox_tui.entry import Terminated, record_sigterm_only, terminated_during_start_up

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory, or None (asyncio's default loop) where uvloop is missing."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows, or an install without it
        return None
    return uvloop.new_event_loop


def run_coroutine(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the fastest loop available; SIGTERM stops it cleanly.

    While the loop runs, SIGTERM goes to the loop's handler, which cancels ``main``
    (a command with handlers of its own, ``--dispatch``, replaces it); the command then
    ends with ``Terminated``, once the loop is closed. The Python-level handler that
    ``outbox_tui.entry`` installs only records the signal meanwhile: raised inside the
    loop's machinery, its exception was lost or left the loop unable to close.
    """
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = record_sigterm_only() if in_main_thread else None
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(_stopped_by_sigterm(main) if in_main_thread else main)
    finally:
        if in_main_thread:  # None: a handler not installed from Python, so the default
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


# The cancel message of a stop by signal; ``--dispatch`` cancels its start-up with it too.
STOP_REQUESTED = "outbox-tui: stop requested"


async def _stopped_by_sigterm(main: Coroutine[Any, Any, T]) -> T:
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None

    def stop() -> None:
        if not task.cancelling():
            task.cancel(msg=STOP_REQUESTED)

    loop.add_signal_handler(signal.SIGTERM, stop)
    if terminated_during_start_up():  # before the line above (or lost during imports)
        stop()
    try:
        return await main
    except asyncio.CancelledError as exc:
        if STOP_REQUESTED not in exc.args:
            raise
        task.uncancel()
        raise Terminated from None
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
