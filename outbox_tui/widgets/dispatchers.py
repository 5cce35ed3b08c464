"""Every heartbeat row: who dispatches, from where, when last seen, and how much."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import DataTable, Static

from engine.operating.insights import HeartbeatView, UnservedType
from outbox_tui import PROG
from outbox_tui.widgets.format import (
    compact,
    count,
    duration,
    fit_list,
    heartbeat_state_text,
    plural,
    served_types,
)

COLUMNS = (
    ("instance", "instance"),
    ("where", "host:pid"),
    ("state", "state"),
    ("seen", "last seen"),
    ("up", "up for"),
    ("iterations", "rounds"),
    ("claimed", "claimed"),
    ("published", "published"),
    ("failed", "failed"),
    ("dead", "dead-lettered"),
    ("serves", "serves"),
)
# Below 110 columns: who, whether alive, and what they delivered; totals abbreviated.
NARROW_COLUMNS = ("instance", "where", "state", "seen", "published", "failed", "dead", "serves")
NARROW_BELOW = 110
# The event types a dispatcher claims take the room the other columns leave, up to
# SERVES_MAX cells. The column shows while some heartbeat says what it serves; with less
# than SERVES_WIDE cells left beside the wide columns it goes with the narrow ones, and
# with less than SERVES_MIN (``12 types``) beside those it is left out.
SERVES_MIN, SERVES_WIDE, SERVES_MAX = 8, 24, 48
CELL_PADDING = 2  # DataTable's default cell_padding, on both sides of a cell

MAX_ROWS = 5
NO_HEARTBEAT = (
    f"No dispatcher has written a heartbeat yet. Run `{PROG} --dispatch` "
    "or press s to start one here."
)


def empty_note(polled: bool, local_dispatch: str) -> str:
    """What the panel says while it lists no heartbeat, consistent with the header.

    Before the first refresh nothing is known yet; while the console's own dispatcher
    starts or runs, its heartbeat is on its way (it writes one within a round), so
    "no dispatcher" would contradict the header's "in-process dispatch: running".
    """
    if local_dispatch in ("starting", "running"):
        return (
            f"In-process dispatcher {local_dispatch}… its heartbeat shows here "
            "after its first round."
        )
    if not polled:
        return "Looking for dispatchers… (starting: waiting for the first refresh)"
    return NO_HEARTBEAT


def _cells(hb: HeartbeatView, narrow: bool) -> dict[str, Text | str]:
    """One heartbeat's cells but "serves" (cut to the room the others leave it)."""
    number = compact if narrow else count
    up = (hb.last_seen_at - hb.started_at).total_seconds()
    return {
        "instance": hb.instance_id,
        "where": f"{hb.host}:{hb.pid}",
        "state": heartbeat_state_text(hb.state, hb.waiting_for),
        "seen": f"{duration(hb.last_seen_age_seconds)} ago",
        "up": duration(up),
        "iterations": number(hb.iterations),
        "claimed": number(hb.total("claimed")),
        "published": number(hb.total("published")),
        "failed": number(hb.total("failed")),
        "dead": number(hb.total("dead_lettered")),
    }


@dataclass(frozen=True, slots=True)
class Layout:
    """The dispatcher table's columns for a width (see plan_columns)."""

    narrow: bool
    serves_room: int | None = None  # None: no serves column
    where: bool = True  # the narrow columns leave out host:pid where the instance repeats it

    @property
    def columns(self) -> list[tuple[str, str]]:
        return [
            (key, "dead" if self.narrow and key == "dead" else label)
            for key, label in COLUMNS
            if (not self.narrow or key in NARROW_COLUMNS)
            and (self.serves_room is not None or key != "serves")
            and (self.where or key != "where")
        ]


def plan_columns(width: int, heartbeats: Sequence[HeartbeatView]) -> Layout:
    """The columns for a table ``width`` cells wide: the wide or narrow ones, and the
    serves column in the room the others leave it, if it gets SERVES_WIDE cells beside the
    wide ones or SERVES_MIN beside the narrow ones (then without host:pid when every
    instance id is its host:pid, as the default one is)."""
    wide = width >= NARROW_BELOW
    if not any(hb.serves is not None for hb in heartbeats):
        return Layout(narrow=not wide)  # every dispatcher is of a version that does not say
    repeats = all(hb.instance_id == f"{hb.host}:{hb.pid}" for hb in heartbeats)
    for layout, least in (
        (Layout(narrow=False), SERVES_WIDE),
        (Layout(narrow=True, where=not repeats), SERVES_MIN),
    ):
        if wide or layout.narrow:
            rows = [_cells(hb, layout.narrow) for hb in heartbeats]
            used = sum(
                max([cell_len(label), *(cell_len(str(row[key])) for row in rows)]) + CELL_PADDING
                for key, label in layout.columns
            )
            room = min(SERVES_MAX, width - used - CELL_PADDING)
            if room >= least:
                return replace(layout, serves_room=room)
    return Layout(narrow=not wide)


UNSERVED = "no dispatcher serves"


def unserved_note(unserved: Sequence[UnservedType], width: int, *, narrow: bool = False) -> str:
    """Each waiting type no live dispatcher serves, with its count and oldest age, in
    ``width`` cells after "no dispatcher serves " (the types that fit, then ``+2 more``).

    ``billing.invoiced (2, oldest 4m 12s), audit.logged (1,204, oldest 3h 05m)``; when not
    even one fits: ``3 types (1,210 events, oldest 3h 05m)``.
    """
    number = compact if narrow else count
    room = width - len(UNSERVED) - 1
    items = [
        f"{u.event_type} ({number(u.count)}, oldest {duration(u.oldest_age_seconds)})"
        for u in unserved
    ]
    fitted = fit_list(items, room, lambda left: f" +{left} more")
    if fitted is not None:
        return fitted
    events = sum(u.count for u in unserved)
    oldest = max(u.oldest_age_seconds for u in unserved)
    return f"{plural(len(unserved), 'type')} ({number(events)} events, oldest {duration(oldest)})"


class DispatchersPanel(Vertical):
    """A small table of ``process_heartbeats``; an explanation when there is none."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.polled = False
        self.local_dispatch = "stopped"
        self.border_title = "Dispatchers"
        self._heartbeats: Sequence[HeartbeatView] = ()
        self._unserved: Sequence[UnservedType] = ()
        self._note_shown: str | None = None

    def compose(self) -> ComposeResult:
        table: DataTable[Text | str] = DataTable(
            id="dispatcher-table", cursor_type="none", zebra_stripes=False
        )
        table.can_focus = False
        yield table
        yield Static(Content(empty_note(False, self.local_dispatch)), id="no-dispatchers")

    def on_mount(self) -> None:
        self.add_class("-empty")  # until the first refresh lists someone

    def on_resize(self) -> None:
        # The columns, the serves cells and the unserved note follow the width.
        self._fill()
        self._show_unserved()

    def local_dispatch_changed(self, state: str) -> None:
        """The console's own dispatcher changed state (the header shows the same)."""
        self.local_dispatch = state
        self._update_note()

    def _update_note(self) -> None:
        note = self.query_one("#no-dispatchers", Static)
        text = empty_note(self.polled, self.local_dispatch)
        if text != self._note_shown:  # unchanged: no redraw
            self._note_shown = text
            note.update(Content(text))

    def show(
        self, heartbeats: Sequence[HeartbeatView], unserved: Sequence[UnservedType] = ()
    ) -> None:
        self.polled = True
        self._update_note()
        heartbeats = [hb for hb in heartbeats if not hb.is_consumer]  # the inbox's have a panel
        alive = sum(1 for hb in heartbeats if hb.state == "alive")
        # The counts are each run's totals (the tiles count rows now): said in the title.
        self.border_title = Content(
            f"Dispatchers · {alive} alive of {len(heartbeats)} · totals since each started"
        )
        self._heartbeats, self._unserved = heartbeats, unserved
        self._show_unserved()
        self._fill()

    def _show_unserved(self) -> None:
        """Events no live dispatcher claims wait silently otherwise: say so where the
        operator looks for "who delivers what", with type, count and age, on the bottom
        border (its corners and blanks take 4 cells)."""
        if not self._unserved:
            self.border_subtitle = None
            return
        narrow = self.size.width < NARROW_BELOW
        note = unserved_note(self._unserved, self.outer_size.width - 4, narrow=narrow)
        self.border_subtitle = Content.from_markup(f"[b $warning]{UNSERVED}[/] $types", types=note)

    def _fill(self) -> None:
        """The table for the width: its columns set up anew when they change (see
        plan_columns), then one row per heartbeat."""
        heartbeats = self._heartbeats
        layout = plan_columns(self.size.width, heartbeats)
        columns, room = layout.columns, layout.serves_room
        table = self.query_one(DataTable)
        shown = [(str(c.key.value), str(c.label)) for c in table.ordered_columns]
        table.clear(columns=shown != columns)
        if shown != columns:
            for key, label in columns:
                table.add_column(label, key=key)
        for hb in heartbeats:
            cells = _cells(hb, layout.narrow)
            if room is not None:
                cells["serves"] = served_types(hb.serves, room)
            table.add_row(*(cells[key] for key, _label in columns), key=hb.instance_id)
        # An explicit height: an auto-height table does not regrow when rows arrive later.
        table.styles.height = min(len(heartbeats), MAX_ROWS) + 1
        self.set_class(not heartbeats, "-empty")
