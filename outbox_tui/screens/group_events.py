"""One error group's events (``enter`` in the groups view): which events failed this way.

The rows come from ``engine.service.group_events`` (every failed row and dead
letter of the group now, read in full; newest first here, at most ``SHOWN``).
``enter`` opens the highlighted event's detail beside the list (over it below 100
columns), as on the main screen; ``escape`` closes the detail, then goes back to
the groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from engine.errors import OutboxError
from engine.operating.error_groups import ErrorGroup, GroupMember, GroupMembers
from engine.service import group_events
from engine.storage.schema import DEAD_LETTER
from outbox_tui.screens.detail_host import DetailHost
from outbox_tui.widgets.event_detail import EventDetailPane
from outbox_tui.widgets.footer import ConsoleFooter
from outbox_tui.widgets.format import age, one_line, short_id, status_text
from outbox_tui.widgets.literal_table import LiteralTable

if TYPE_CHECKING:
    from outbox_tui.app import OutboxConsole

#: Rows listed at most (newest first); the title says when there are more.
SHOWN = 1_000


@dataclass
class MembersLoaded(Message):
    found: GroupMembers | None
    error: str | None = None


class GroupEventsScreen(DetailHost):
    """The failed rows and dead letters of one error group, newest first."""

    BINDINGS = [  # noqa: RUF012 - Textual's declaration style
        Binding("escape", "back", "Back"),
        # priority: the table's own enter (select_cursor, not shown) would hide it
        Binding("enter", "open_detail", "Detail", priority=True),
        Binding("ctrl+r", "reload", "Refresh"),
    ]

    def __init__(self, console: OutboxConsole, group: ErrorGroup) -> None:
        super().__init__(console, id="group-events-screen")
        self.group = group
        self.members: list[GroupMember] = []
        self.loads = 0  # lists loaded (tests wait on this)

    def compose(self) -> ComposeResult:
        yield Static(f"Error group {self.group.fingerprint}: loading…", id="group-events-title")
        with Horizontal(id="body"):
            with Vertical(id="list"):
                yield LiteralTable(id="group-events", cursor_type="row", zebra_stripes=True)
            yield EventDetailPane(
                id="detail", trace_url_template=self.console.config.trace_url_template
            )
        yield ConsoleFooter()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("id", "status", "type", "tenant", "age", "error")
        self.query_one("#list").border_title = one_line(self.group.message, 90)
        table.focus()
        self.action_reload()

    def action_reload(self) -> None:
        self._load()

    @work(exclusive=True, group="group-events", exit_on_error=False)
    async def _load(self) -> None:
        console = self.console
        try:
            found = await console.db(group_events(console.engine, self.group.fingerprint))
        except OutboxError as exc:
            self.post_message(MembersLoaded(None, one_line(exc)))
            return
        self.post_message(MembersLoaded(found))

    @on(MembersLoaded)
    def _loaded(self, message: MembersLoaded) -> None:
        title = self.query_one("#group-events-title", Static)
        fingerprint = self.group.fingerprint
        if message.found is None:
            title.update(f"Error group {fingerprint}: {message.error}")
            return
        members = list(reversed(message.found.members))  # newest first
        self.members = members[:SHOWN]
        table = self.query_one(DataTable)
        table.clear()
        now = self.console.clock()
        for member in self.members:
            table.add_row(
                short_id(member.id),
                status_text(member.status),
                member.event_type,
                member.tenant_id,
                age(member.created_at, now),
                one_line(member.error, 120),
                key=member.id,
            )
        dead = sum(1 for m in members if m.status == DEAD_LETTER)
        more = f" (newest {SHOWN:,} shown)" if len(members) > SHOWN else ""
        title.update(
            f"Error group {fingerprint}: {len(members):,} events{more}, {dead:,} dead letters"
        )
        self.query_one("#list").border_subtitle = f"{len(self.members):,} shown"
        self.loads += 1
        if self.detail_open:
            self.load_detail()

    # -- detail -------------------------------------------------------------------------

    def highlighted(self) -> GroupMember | None:
        table = self.query_one(DataTable)
        if not self.members or table.row_count == 0:
            return None
        return self.members[min(table.cursor_row, len(self.members) - 1)]

    @on(DataTable.RowSelected, "#group-events")
    def _row_selected(self) -> None:
        self.open_detail_from_list()

    @on(DataTable.RowHighlighted, "#group-events")
    def _row_highlighted(self) -> None:
        self.follow_cursor()

    def detail_list(self) -> DataTable[Any]:
        return self.query_one(DataTable)

    def detail_target_id(self) -> str | None:
        member = self.highlighted()
        return None if member is None else member.id

    def action_back(self) -> None:
        if self.detail_open:
            self.detail_open = False
            return
        self.app.pop_screen()
