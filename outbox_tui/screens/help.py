"""``?``: every key of the console, grouped, in one dialog."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

KEYS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "Views",
        (
            ("e", "events: every event, newest first"),
            ("d", "dead letters: events that need an operator"),
            ("b", "blocked keys: ordering keys held back by a failed or dead head"),
            ("w", "the undelivered events of the highlighted ordering key"),
            ("enter", "open the detail of the highlighted event (follows the cursor)"),
            ("escape", "close the detail"),
            ("tab", "move between the table and the detail (to scroll it)"),
            ("↑ ↓ pgup pgdn", "move in the table"),
            ("] / [", "older / newer page (keyset paging, 100 at a time)"),
            ("home", "back to the newest page"),
        ),
    ),
    (
        "Filter",
        (
            ("/", "filter by status, event type, tenant, aggregate id, ordering key"),
            ("ctrl+l", "in the filter dialog: clear every field"),
        ),
    ),
    (
        "Act",
        (
            ("r", "replay the highlighted dead letter (asks first)"),
            ("R", "replay every dead letter matching the filter (asks first)"),
            ("k", "skip the highlighted dead letter: its key goes on (asks first)"),
            ("s", "start or stop the in-process dispatcher (stop asks first)"),
            ("y / n", "in a confirmation: proceed / cancel (escape cancels too)"),
        ),
    ),
    (
        "Console",
        (
            ("ctrl+r", "refresh now"),
            ("ctrl+p", "command palette: every action by name"),
            ("?", "this help"),
            ("q", "quit (stops the in-process dispatcher gracefully first)"),
        ),
    ),
)


def keys_table() -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold #5fafff", no_wrap=True, min_width=14, justify="right")
    table.add_column()
    for index, (group, keys) in enumerate(KEYS):
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
    ]

    def __init__(self) -> None:
        super().__init__(classes="dialog-screen")

    def compose(self) -> ComposeResult:
        with Vertical(id="help-dialog", classes="dialog"):
            yield Label("Keys", classes="dialog-title")
            yield Static(keys_table(), id="help-keys")
            yield Static(
                Text(
                    "Rows change status on the next refresh. The console only reads, except "
                    "for replays, skips and its own dispatcher.",
                    style="#8a8a8a",
                ),
                id="help-footnote",
            )

    def action_close(self) -> None:
        self.dismiss(None)
