"""The inbox's consumers (``outbox-tui consume``): where each reads, and what it stored."""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import DataTable

from engine.operating.insights import HeartbeatView
from outbox_tui.widgets.format import compact, count, duration, heartbeat_state_text

COLUMNS = (
    ("instance", "instance"),
    ("where", "host:pid"),
    ("state", "state"),
    ("seen", "last seen"),
    ("queue", "queue"),
    ("received", "received"),
    ("stored", "stored"),
    ("duplicates", "duplicates"),
    ("rejected", "dead-lettered"),
)
# Below 110 columns: who, whether alive, from where, and what became of the messages,
# with short labels; the queue gets the room the others leave it.
NARROW_COLUMNS = {
    "instance": "instance",
    "state": "state",
    "queue": "queue",
    "stored": "stored",
    "duplicates": "dup",
    "rejected": "dead",
}
NARROW_BELOW = 110
MAX_ROWS = 3
CELL_PADDING = 2  # DataTable's default cell_padding, on both sides of a cell
QUEUE_MIN = 8


def _state(hb: HeartbeatView, narrow: bool) -> Text:
    state = heartbeat_state_text(hb.state, hb.waiting_for)
    if narrow and hb.state == "alive" and hb.waiting_for:  # "alive · waiting for broker"
        return Text(str(state).split(" · ", 1)[1].replace(" for ", " "), style=state.style)
    return state


def _cells(hb: HeartbeatView, narrow: bool) -> dict[str, Text | str]:
    number = compact if narrow else count
    return {
        "instance": hb.instance_id,
        "where": f"{hb.host}:{hb.pid}",
        "state": _state(hb, narrow),
        "seen": f"{duration(hb.last_seen_age_seconds)} ago",
        "queue": hb.queue or "-",
        "received": number(hb.total("received")),
        "stored": number(hb.total("stored")),
        "duplicates": number(hb.total("duplicates")),
        "rejected": number(hb.total("rejected")),
    }


def _cut(text: str, width: int) -> str:
    return text if cell_len(text) <= width else text[: max(1, width - 1)] + "…"


class ConsumersPanel(Vertical):
    """A small table of the consumers' heartbeats; shown only while there is one. Its
    title gives the dedup window: how long the inbox remembers an event's identity."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.border_title = "Inbox consumers"
        self._heartbeats: Sequence[HeartbeatView] = ()
        self._columns: list[tuple[str, str]] = []

    def compose(self) -> ComposeResult:
        table: DataTable[Text | str] = DataTable(
            id="consumer-table", cursor_type="none", zebra_stripes=False
        )
        table.can_focus = False
        yield table

    def on_mount(self) -> None:
        self.add_class("-empty")

    def on_resize(self) -> None:
        self._fill()

    def show(self, heartbeats: Sequence[HeartbeatView], window_seconds: float | None) -> None:
        consumers = [hb for hb in heartbeats if hb.is_consumer]
        alive = sum(1 for hb in consumers if hb.state == "alive")
        title = f"Inbox consumers · {alive} alive of {len(consumers)}"
        if window_seconds is not None:
            title += f" · dedup window {duration(window_seconds)}"
        self.border_title = Content(title)
        self._heartbeats = consumers
        self.set_class(not consumers, "-empty")
        self._fill()

    def _fill(self) -> None:
        width = self.size.width
        columns, rows = self._layout(narrow=False)
        narrow = width < NARROW_BELOW or _used(columns, rows) > width - CELL_PADDING
        if narrow:  # the queue takes the room the other columns leave
            columns, rows = self._layout(narrow=True)
            others = [(key, label) for key, label in columns if key != "queue"]
            room = max(QUEUE_MIN, width - _used(others, rows) - 2 * CELL_PADDING)
            for row in rows:
                row["queue"] = _cut(str(row["queue"]), room)
        table = self.query_one(DataTable)
        table.clear(columns=columns != self._columns)
        if columns != self._columns:
            for key, label in columns:
                table.add_column(label, key=key)
            self._columns = columns
        for hb, cells in zip(self._heartbeats, rows, strict=True):
            table.add_row(*(cells[key] for key, _label in columns), key=hb.instance_id)
        table.styles.height = min(len(self._heartbeats), MAX_ROWS) + 1

    def _layout(self, *, narrow: bool) -> tuple[list[tuple[str, str]], list[dict[str, Text | str]]]:
        columns = [
            (key, NARROW_COLUMNS[key] if narrow else label)
            for key, label in COLUMNS
            if not narrow or key in NARROW_COLUMNS
        ]
        return columns, [_cells(hb, narrow) for hb in self._heartbeats]


def _used(columns: list[tuple[str, str]], rows: list[dict[str, Text | str]]) -> int:
    """The cells ``columns`` take, each as wide as its label or its widest value."""
    return sum(
        max([cell_len(label), *(cell_len(str(row[key])) for row in rows)]) + CELL_PADDING
        for key, label in columns
    )
