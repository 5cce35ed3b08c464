"""The one-line header: where the console looks, whether it can, and who dispatches."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

CONNECTION_LOOK = {
    "connecting": ("○ connecting…", "#8a8a8a"),
    "connected": ("● connected", "bold #87d787"),
    "lost": ("● unreachable, retrying", "bold #ff5f5f"),
}
DISPATCH_LOOK = {
    "stopped": ("stopped", "#8a8a8a"),
    "starting": ("starting…", "bold #ffaf5f"),
    "running": ("running", "bold #87d787"),
    "stopping": ("stopping (finishing batch)…", "bold #ffaf5f"),
}


class StatusBar(Static):
    """``outbox-tui │ URL │ ● connected │ refresh 2s │ dispatch: running (2 handlers)``."""

    connection: reactive[str] = reactive("connecting")
    dispatch: reactive[str] = reactive("stopped")
    dispatch_target: reactive[str] = reactive("")

    def __init__(self, url: str, refresh_seconds: float, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.url = url
        self.refresh_seconds = refresh_seconds

    def render(self) -> Text:
        sep = ("  │  ", "#5f5f5f")
        label, style = CONNECTION_LOOK[self.connection]
        dispatch, dispatch_style = DISPATCH_LOOK[self.dispatch]
        parts: list[tuple[str, str] | str] = [
            (" outbox-tui", "bold"),
            sep,
            (self.url, "#d0d0d0"),
            sep,
            (label, style),
            sep,
            f"refresh {self.refresh_seconds:g}s",
            sep,
            "in-process dispatch: ",
            (dispatch, dispatch_style),
        ]
        if self.dispatch in ("running", "stopping") and self.dispatch_target:
            parts.append((f" → {self.dispatch_target}", "#8a8a8a"))
        return Text.assemble(*parts, no_wrap=True, overflow="ellipsis")
