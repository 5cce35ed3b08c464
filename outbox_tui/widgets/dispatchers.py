"""Every heartbeat row: who dispatches, from where, when last seen, and how much."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import DataTable, Static

from engine.insights import HeartbeatView, UnservedType
from outbox_tui.widgets.format import count, duration, heartbeat_state_text

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

MAX_ROWS = 5
NO_HEARTBEAT = (
    "No dispatcher has written a heartbeat yet. Run `outbox-tui --dispatch` "
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

    def compose(self) -> ComposeResult:
        table: DataTable[Text | str] = DataTable(
            id="dispatcher-table", cursor_type="none", zebra_stripes=False
        )
        table.can_focus = False
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        yield table
        yield Static(Content(empty_note(False, self.local_dispatch)), id="no-dispatchers")

    def on_mount(self) -> None:
        self.add_class("-empty")  # until the first refresh lists someone

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
        table = self.query_one(DataTable)
        table.clear()
        for hb in heartbeats:
            up = (hb.last_seen_at - hb.started_at).total_seconds()
            table.add_row(
                hb.instance_id,
                f"{hb.host}:{hb.pid}",
                heartbeat_state_text(hb.state, hb.waiting_for),
                f"{duration(hb.last_seen_age_seconds)} ago",
                duration(up),
                count(hb.iterations),
                count(hb.total("claimed")),
                count(hb.total("published")),
                count(hb.total("failed")),
                count(hb.total("dead_lettered")),
                key=hb.instance_id,
            )
        # An explicit height: an auto-height table does not regrow when rows arrive later.
        table.styles.height = min(len(heartbeats), MAX_ROWS) + 1
        self.set_class(not heartbeats, "-empty")
