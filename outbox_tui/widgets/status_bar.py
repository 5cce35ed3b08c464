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

    def __init__(self, url: str, refresh_seconds: float, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.url = url
        self.refresh_seconds = refresh_seconds

    def render(self) -> Text:
        """The longest variant that fits: less important parts go first, the URL last.

        Connection and dispatch state always show; at 80 columns the URL keeps its
        tail (the database name) behind an ellipsis.
        """
        width = self.content_size.width
        label, style = CONNECTION_LOOK[self.connection]
        dispatch, dispatch_style = DISPATCH_LOOK[self.dispatch]
        target = ""
        if self.dispatch in ("running", "stopping") and self.dispatch_target:
            target = f" → {self.dispatch_target}"
        variants = (
            (True, True, "in-process dispatch: ", target),
            (True, True, "in-process dispatch: ", ""),
            (False, True, "in-process dispatch: ", ""),
            (False, False, "in-process dispatch: ", ""),
            (False, False, "dispatch: ", ""),
        )
        for name, refresh, dispatch_label, tail in variants:
            text = self._line(name, refresh, dispatch_label, self.url, label, style)
            text.append(dispatch, style=dispatch_style)
            text.append(tail, style="#8a8a8a")
            if text.cell_len <= width:
                return text
        # Still too long: the URL gives way, keeping its tail.
        room = max(4, len(self.url) - (text.cell_len - width))
        url = "…" + self.url[-(room - 1) :]
        text = self._line(False, False, "dispatch: ", url, label, style)
        text.append(dispatch, style=dispatch_style)
        text.no_wrap, text.overflow = True, "ellipsis"
        return text

    def _line(self, name: bool, refresh: bool, dispatch_label: str, url: str, *look: str) -> Text:
        label, style = look
        sep = ("  │  ", "#5f5f5f")
        parts: list[tuple[str, str] | str] = []
        if name:
            parts += [(" outbox-tui", "bold"), sep]
        else:
            parts.append(" ")
        parts += [(url, "#d0d0d0"), sep, (label, style), sep]
        if refresh:
            parts += [f"refresh {self.refresh_seconds:g}s", sep]
        parts.append(dispatch_label)
        return Text.assemble(*parts, no_wrap=True)
