"""What the console's screens and their parts share: the app's services, how to say things.

A ``ScreenPart`` is a piece of a screen with no pixels of its own (the main screen's
replay, skip, pause, dispatch switch and published recount): it is constructed with
what it uses and mounted hidden beside the panels, so its workers, their messages and
its dialogs run on a node of its own instead of on the screen that hosts it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widget import Widget
from textual.worker import Worker, WorkerState

from outbox_tui.messages import WorkerFailed

if TYPE_CHECKING:
    from outbox_tui.app import OutboxConsole


def toast(
    node: Widget,
    message: str,
    *,
    title: str = "",
    severity: SeverityLevel = "information",
    timeout: float = 5.0,
) -> None:
    """A toast; the text is shown as is (error messages are not markup)."""
    node.notify(message, title=title, severity=severity, timeout=timeout, markup=False)


class ConsoleScreen(Screen[None]):
    """A screen of the console, given the app's services when it is made."""

    def __init__(self, console: OutboxConsole, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.console = console

    def say(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float = 5.0,
    ) -> None:
        toast(self, message, title=title, severity=severity, timeout=timeout)


class ScreenPart(Widget):
    """A hidden part of a screen: workers, their messages and dialogs, no pixels.

    Textual's ``Worker.StateChanged`` stays on the node that ran the worker, so a part
    reports an unexpected worker failure to its screen as a ``WorkerFailed`` (which
    bubbles): the screen remains the one place such a failure is shown.
    """

    DEFAULT_CSS = "ScreenPart { display: none; }"

    def __init__(self, console: OutboxConsole) -> None:
        super().__init__()
        self.console = console

    def say(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float = 5.0,
    ) -> None:
        toast(self, message, title=title, severity=severity, timeout=timeout)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.post_message(WorkerFailed(event.worker.group, event.worker.error))
