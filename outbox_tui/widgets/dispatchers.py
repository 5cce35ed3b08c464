"""Every heartbeat row: who dispatches, from where, when last seen, and how much."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import DataTable, Static

from engine.insights import HeartbeatView, UnservedType
from outbox_tui import PROG
from outbox_tui.widgets.format import compact, count, duration, heartbeat_state_text

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
    ("dead", "dead letter"),
)
# Below 110 columns: who, whether alive, and what they delivered; totals abbreviated.
NARROW_COLUMNS = ("instance", "where", "state", "seen", "published", "failed", "dead")
NARROW_BELOW = 110

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


class DispatchersPanel(Vertical):
    """A small table of ``process_heartbeats``; an explanation when there is none."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.polled = False
        self.local_dispatch = "stopped"
        self.border_title = "Dispatchers"
        self._heartbeats: Sequence[HeartbeatView] = ()
        self._narrow: bool | None = None

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
        if self._columns_fit():
            return
        self._fill(self._heartbeats)

    def _columns_fit(self) -> bool:
        """Whether the table's columns suit the width (set up anew when not)."""
        narrow = self.size.width < NARROW_BELOW
        if narrow == self._narrow:
            return True
        self._narrow = narrow
        table = self.query_one(DataTable)
        table.clear(columns=True)
        for key, label in COLUMNS:
            if not narrow or key in NARROW_COLUMNS:
                table.add_column("dead" if narrow and key == "dead" else label, key=key)
        return False

    def local_dispatch_changed(self, state: str) -> None:
        """The console's own dispatcher changed state (the header shows the same)."""
        self.local_dispatch = state
        self._update_note()

    def _update_note(self) -> None:
        note = self.query_one("#no-dispatchers", Static)
        note.update(Content(empty_note(self.polled, self.local_dispatch)))

    def show(
        self, heartbeats: Sequence[HeartbeatView], unserved: Sequence[UnservedType] = ()
    ) -> None:
        self.polled = True
        self._update_note()
        alive = sum(1 for hb in heartbeats if hb.state == "alive")
        self.border_title = Content(f"Dispatchers · {alive} alive of {len(heartbeats)}")
        # Events no live dispatcher claims wait silently otherwise: say so where the
        # operator looks for "who delivers what".
        self.border_subtitle = (
            Content.from_markup(
                "[b $warning]no dispatcher serves[/] $types",
                types=", ".join(f"{u.event_type} ({count(u.count)})" for u in unserved),
            )
            if unserved
            else None
        )
        self._heartbeats = heartbeats
        self._columns_fit()
        self._fill(heartbeats)

    def _fill(self, heartbeats: Sequence[HeartbeatView]) -> None:
        table = self.query_one(DataTable)
        table.clear()
        number = compact if self._narrow else count
        keys = [str(column.key.value) for column in table.ordered_columns]
        for hb in heartbeats:
            up = (hb.last_seen_at - hb.started_at).total_seconds()
            cells: dict[str, Text | str] = {
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
            table.add_row(*(cells[key] for key in keys), key=hb.instance_id)
        # An explicit height: an auto-height table does not regrow when rows arrive later.
        table.styles.height = min(len(heartbeats), MAX_ROWS) + 1
        self.set_class(not heartbeats, "-empty")
