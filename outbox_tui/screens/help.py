"""``?``: every key of the console, grouped, in one dialog (from ``outbox_tui.actions``)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from outbox_tui.actions import help_rows, what_changes

PAGE = 10  # lines a pagedown or pageup moves the help


def keys_table(page_size: int = 100) -> Table:
    """Every key, grouped, from the console's action table."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold #5fafff", no_wrap=True, min_width=14, justify="right")
    table.add_column()
    for index, (group, keys) in enumerate(help_rows(page_size)):
        if index:
            table.add_row("", "")
        table.add_row("", Text(group, style="bold"))
        for key, what in keys:
            table.add_row(key, what)
    return table


class HelpScreen(ModalScreen[None]):
    """Closed by escape, ``?`` or ``q``."""

    BINDINGS = [  # noqa: RUF012 - Textual's declaration style
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", "Close", show=False),
        Binding("q", "close", "Close", show=False),
        # Every press moves at once (no animation): an animated scroll aims from where
        # the box is drawn, so a burst of downs moved it one line.
        *(
            Binding(key, f"scroll({lines})", show=False, priority=True)
            for key, lines in (
                ("down", 1),
                ("up", -1),
                ("pagedown", PAGE),
                ("pageup", -PAGE),
                ("end", 10_000),
                ("home", -10_000),
            )
        ),
    ]

    def __init__(self, page_size: int = 100) -> None:
        super().__init__(classes="dialog-screen")
        self.page_size = page_size

    def compose(self) -> ComposeResult:
        # Scrolls (arrows, pgup/pgdn) where the terminal is shorter than the keys.
        with VerticalScroll(id="help-dialog", classes="dialog") as box:
            box.border_subtitle = "↑ ↓ scroll · esc close"
            yield Label("Keys", classes="dialog-title")
            yield Static(keys_table(self.page_size), id="help-keys")
            yield Static(
                Text(f"Rows change status on the next refresh. {what_changes()}", style="#8a8a8a"),
                id="help-footnote",
            )

    def action_scroll(self, lines: int) -> None:
        box = self.query_one("#help-dialog", VerticalScroll)
        box.scroll_to(y=box.scroll_y + lines, animate=False, immediate=True)

    def action_close(self) -> None:
        self.dismiss(None)
