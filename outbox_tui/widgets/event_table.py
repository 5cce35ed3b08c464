"""The event list: one page of a keyset query, newest first, cursor kept across refreshes.

Its columns are planned for its width (``plan_columns``): in order of importance, as
many as fit whole, the last one (the error) taking the room left when that is enough
for it; the others are left out, so a narrow terminal never shows a cut header ("te"
for tenant). Widening or narrowing the terminal plans them again.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.cache import LRUCache
from textual.coordinate import Coordinate
from textual.strip import Strip

from engine.operating.insights import EventSummary
from outbox_tui.widgets.format import (
    MUTED_STYLE,
    age,
    one_line,
    relative,
    short_id,
    status_text,
)
from outbox_tui.widgets.literal_table import LiteralTable

# The columns an operator scans first come first, so they stay visible beside the detail.
EVENT_COLUMNS = (
    ("id", "id"),
    ("status", "status"),
    ("type", "type"),
    ("attempts", "tries"),
    ("age", "age"),
    ("retry", "next retry"),
    ("tenant", "tenant"),
    ("aggregate", "aggregate"),
    ("error", "last error"),
)
DEAD_LETTER_COLUMNS = (
    ("id", "id"),
    ("type", "type"),
    ("attempts", "tries"),
    ("age", "age"),
    ("replays", "replays"),
    ("tenant", "tenant"),
    ("aggregate", "aggregate"),
    ("reason", "dead-letter reason"),
)


ELASTIC = ("error", "reason")  # the last column: its text is cut to the room left
ELASTIC_MIN = 20  # cells the error needs to be worth showing
PADDING = 2  # DataTable's cell padding, one cell each side
SCROLLBAR = 2  # the vertical scrollbar beside the rows (Textual's default size)


def plan_columns(
    columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Text | str]], width: int
) -> tuple[tuple[str, ...], int]:
    """The keys of the columns that fit ``width`` whole, in order, and the room the last
    (elastic) column gets. ``rows`` hold every column's cell; a column is as wide as its
    label or its widest cell. The first column that does not fit ends the plan."""
    room = width - SCROLLBAR
    chosen: list[str] = []
    used = 0
    for index, (key, label) in enumerate(columns):
        if key in ELASTIC:
            left = room - used - PADDING
            if left >= max(len(label), ELASTIC_MIN):
                chosen.append(key)
                return tuple(chosen), left
            break
        wide = max([cell_len(label)] + [_cell_width(row[index]) for row in rows]) + PADDING
        if used + wide > room and chosen:
            break
        chosen.append(key)
        used += wide
    return tuple(chosen), 0


def _cell_width(cell: Text | str) -> int:
    return cell_len(cell.plain if isinstance(cell, Text) else cell)


class EventTable(LiteralTable[Text | str]):
    """Rows keyed by event id; ``enter`` asks for the detail of the highlighted one."""

    BINDINGS = [  # noqa: RUF012 - Textual's declaration style
        # enter has an obvious meaning: the footer keeps its room for the incident keys
        Binding("enter", "select_cursor", "Detail", id="detail", show=False),
        # DataTable's home only scrolls; here it also returns to the newest page.
        Binding("home", "screen.first_page", "Newest", show=False),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, id=id)
        self.mode = ""
        self._events: dict[str, EventSummary] = {}
        self._cells_shown: dict[str, list[Text | str]] = {}
        self._lines: LRUCache[tuple[object, ...], tuple[tuple[object, ...], Strip]]
        self._lines = LRUCache(512)
        self.top_on_next_page = False  # the next new page opens with its first row highlighted
        self.planned: tuple[str, ...] = ()  # the keys of the columns shown
        self._elastic_room = 0
        self._last: tuple[str, Sequence[EventSummary], datetime] | None = None

    @property
    def events(self) -> list[EventSummary]:
        return list(self._events.values())

    @property
    def highlighted(self) -> EventSummary | None:
        if not self._events or self.cursor_row < 0 or self.cursor_row >= self.row_count:
            return None
        key = self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0)).row_key.value
        return self._events.get(key or "")

    def show(
        self,
        mode: str,
        events: Sequence[EventSummary],
        now: datetime,
        *,
        follow_head: bool = True,
    ) -> None:
        """Replace the rows, keeping the cursor on the same event when it is still listed.

        With ``follow_head`` a cursor on the first row stays on the first row, so new
        events arrive under it (like ``tail -f``); anywhere else, or while the operator
        reads a detail, it stays on the event it was on.
        """
        current = self.highlighted
        following = follow_head and self.cursor_row == 0
        keep = current.id if current and not following else None
        row_before, offset = self.cursor_row, self.cursor_row - round(self.scroll_y)
        self._last = (mode, events, now)
        columns = DEAD_LETTER_COLUMNS if mode == "dead_letters" else EVENT_COLUMNS
        full = [self._cells(e, now, mode=mode) for e in events]
        planned, self._elastic_room = plan_columns(columns, full, self.size.width or 10_000)
        if mode != self.mode or planned != self.planned:
            self.clear(columns=True)
            for key, label in columns:
                if key in planned:
                    self.add_column(label, key=key)
            if mode != self.mode:
                keep, row_before, offset = None, 0, 0
            self.mode, self.planned = mode, planned
            self._cells_shown = {}
        elif [e.id for e in events] == list(self._events):
            # The same rows (a refresh of an unchanged page): update in place, no jump, and
            # only the cells that changed: each update makes the table draw its rows again.
            self._events = {e.id: e for e in events}
            keys = [c.key for c in self.ordered_columns]
            for event in events:
                cells = self._cells(event, now)
                shown = self._cells_shown.get(event.id, [])
                for i, (column, value) in enumerate(zip(keys, cells, strict=True)):
                    if i >= len(shown) or not _same_cell(shown[i], value):
                        self.update_cell(event.id, column, value)
                self._cells_shown[event.id] = cells
            return
        else:
            self.clear()
        self._events = {e.id: e for e in events}
        self._cells_shown = {}
        for event in events:
            cells = self._cells_shown[event.id] = self._cells(event, now)
            self.add_row(*cells, key=event.id)
        if not events:
            return
        ids = list(self._events)
        if self.top_on_next_page:
            self.top_on_next_page = False
            keep, row_before, offset = None, 0, 0
        row = ids.index(keep) if keep in ids else min(max(row_before, 0), len(ids) - 1)
        self.move_cursor(row=row, animate=False, scroll=False)
        # Keep the highlighted event where it was on screen, as far as the rows allow.
        target = max(0, row - max(0, offset))
        self.call_after_refresh(self.scroll_to, y=target, animate=False, immediate=True)

    def _render_line(self, y: int, x1: int, x2: int, base_style: Style) -> Strip:
        """A row's line drawn before, with the same cells and look, is not drawn again.

        DataTable keys its caches on a counter every ``update_cell`` bumps, so one changed
        age had every visible line drawn again, cell by cell, each refresh (decision
        0032). Cells are compared by identity: ``show`` keeps the value of a cell whose
        text did not change, and gives a changed cell a new one.
        """
        try:
            row_key, line = self._get_offsets(y)
        except LookupError:
            return super()._render_line(y, x1, x2, base_style)
        values = self._data.get(row_key)
        if values is None:  # the header
            return super()._render_line(y, x1, x2, base_style)
        cells = tuple(values.values())
        key = (
            y,
            x1,
            x2,
            self.size.width,
            row_key,
            line,
            tuple((c.key, c.get_render_width(self)) for c in self.ordered_columns),
            self.cursor_coordinate,
            self.hover_coordinate,
            base_style,
            self.cursor_type,
            self.show_cursor,
            self._show_hover_cursor,
            self._pseudo_class_state,
            self.app.theme,
        )
        drawn = self._lines.get(key)
        if drawn is not None and _same_objects(drawn[0], cells):
            return drawn[1]
        strip = super()._render_line(y, x1, x2, base_style)
        self._lines[key] = (cells, strip)
        return strip

    def on_resize(self) -> None:
        """Plan the columns again for the new width (the rows stay as they are)."""
        if self._last is not None:
            self.show(*self._last, follow_head=False)

    def _cells(
        self, e: EventSummary, now: datetime, *, mode: str | None = None
    ) -> list[Text | str]:
        """The planned columns' cells (every column's, given the ``mode`` to plan)."""
        cells = self._all_cells(e, now, mode or self.mode)
        if mode is not None:
            return cells
        columns = DEAD_LETTER_COLUMNS if self.mode == "dead_letters" else EVENT_COLUMNS
        return [c for (key, _label), c in zip(columns, cells, strict=True) if key in self.planned]

    def _elastic(self, text: str | None, wide: int) -> str:
        """The error's text: the room the plan left it, or (before a plan) ``wide``."""
        return one_line(text, self._elastic_room or wide)

    def _all_cells(self, e: EventSummary, now: datetime, mode: str) -> list[Text | str]:
        kind = f"{e.event_type} v{e.event_version}"
        aggregate = one_line(f"{e.aggregate_type}:{e.aggregate_id}", 26)
        attempts = f"{e.attempt_count}/{e.max_attempts}"
        if mode == "dead_letters":
            return [
                Text(short_id(e.id), style=MUTED_STYLE),
                kind,
                attempts,
                age(e.created_at, now),
                str(e.replay_count) if e.replay_count else "—",
                e.tenant_id,
                aggregate,
                self._elastic(e.dead_letter_reason, max(40, self.size.width - 70)),
            ]
        retry: Text | str = "—"
        if e.status == "failed" and e.next_retry_at is not None:
            if e.next_retry_at > now:
                retry = relative(e.next_retry_at, now)
            else:  # due, and nobody has picked it up: worth a colour
                retry = Text(f"due {age(e.next_retry_at, now)} ago", style="#ffaf5f")
        return [
            Text(short_id(e.id), style=MUTED_STYLE),
            status_text(e.status),
            kind,
            attempts,
            age(e.created_at, now),
            retry,
            e.tenant_id,
            aggregate,
            # Wide terminals give the error the room the other columns leave.
            Text(self._elastic(e.last_error, max(40, self.size.width - 100)), style=MUTED_STYLE),
        ]


def _same_objects(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _same_cell(a: Text | str, b: Text | str) -> bool:
    """Whether two cells draw the same (rich's ``Text ==`` ignores the base style)."""
    if isinstance(a, Text) and isinstance(b, Text):
        return a.plain == b.plain and a.style == b.style and a.spans == b.spans
    return type(a) is type(b) and a == b
