"""``b``: the ordering keys held back by their head, oldest head first.

A key is blocked while its head (its earliest undelivered event) has failed and
waits for a retry, or was dead-lettered and not skipped: the events behind it
wait. Each row is one key: its head's status, type, age and error, and how many
events wait behind it.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.binding import Binding
from textual.coordinate import Coordinate

from engine.operating.insights import BlockedKey
from outbox_tui.widgets.format import MUTED_STYLE, duration, one_line, short_id, status_text
from outbox_tui.widgets.literal_table import LiteralTable

BLOCKED_COLUMNS = (
    ("key", "ordering key"),
    ("waiting", "waiting"),
    ("status", "head status"),
    ("age", "head age"),
    ("type", "head type"),
    ("head", "head id"),
    ("error", "head error"),
)
WAITING_STYLE = "bold #ffaf5f"


class BlockedKeysTable(LiteralTable[Text | str]):
    """Rows keyed by ordering key; ``enter`` opens the detail of the key's head."""

    BINDINGS = [  # noqa: RUF012 - Textual's declaration style
        Binding("enter", "select_cursor", "Head detail", id="head-detail"),
        Binding("home", "screen.first_page", "First", show=False),  # to the oldest head
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, id=id)
        self._keys: dict[str, BlockedKey] = {}
        for key, label in BLOCKED_COLUMNS:
            self.add_column(label, key=key)

    @property
    def blocked_keys(self) -> list[BlockedKey]:
        return list(self._keys.values())

    @property
    def highlighted(self) -> BlockedKey | None:
        if not self._keys or self.cursor_row < 0 or self.cursor_row >= self.row_count:
            return None
        key = self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0)).row_key.value
        return self._keys.get(key or "")

    def show(self, keys: Sequence[BlockedKey]) -> None:
        """Replace the rows; the cursor stays on the same key while it is still blocked."""
        current = self.highlighted
        row_before = self.cursor_row
        if [k.ordering_key for k in keys] == list(self._keys):
            self._keys = {k.ordering_key: k for k in keys}
            columns = [c.key for c in self.ordered_columns]
            for blocked in keys:
                for column, value in zip(columns, self._cells(blocked), strict=True):
                    self.update_cell(blocked.ordering_key, column, value)
            return
        self.clear()
        self._keys = {k.ordering_key: k for k in keys}
        for blocked in keys:
            self.add_row(*self._cells(blocked), key=blocked.ordering_key)
        if not keys:
            return
        names = list(self._keys)
        if current is not None and current.ordering_key in names:
            row = names.index(current.ordering_key)
        else:
            row = min(max(row_before, 0), len(names) - 1)
        self.move_cursor(row=row, animate=False)

    def on_resize(self) -> None:
        if self._keys:  # the same keys: their cells again, for the new width
            self.show(self.blocked_keys)

    def _cells(self, k: BlockedKey) -> list[Text | str]:
        waiting = Text(f"{k.waiting:,}", style=WAITING_STYLE if k.waiting else MUTED_STYLE)
        # Narrow terminals: the key gives way, so the waiting count after it shows whole.
        # By the terminal's width: the table may still be hidden (no size) when it fills.
        key_width = 48 if self.app.size.width >= 100 else 22
        return [
            one_line(k.ordering_key, key_width),
            waiting,
            status_text(k.head_status),
            duration(k.head_age_seconds),
            k.head_event_type,
            Text(short_id(k.head_id), style=MUTED_STYLE),
            Text(one_line(k.head_error, 50), style=MUTED_STYLE),
        ]
