"""What every part of the main screen shares: the app's services and how to say things."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.notifications import SeverityLevel
from textual.screen import Screen

if TYPE_CHECKING:
    from outbox_tui.app import OutboxConsole


class ConsoleScreen(Screen[None]):
    """A part of the main screen (``MainScreen`` combines them)."""

    @property
    def console_app(self) -> OutboxConsole:
        return self.app  # type: ignore[return-value]

    def say(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float = 5.0,
    ) -> None:
        """A toast; the text is shown as is (error messages are not markup)."""
        self.notify(message, title=title, severity=severity, timeout=timeout, markup=False)
