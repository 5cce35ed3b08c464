"""The error groups (``g``): which failures are the same failure, and ``R`` to replay one.

The groups come from ``engine.service.error_groups`` (the same as ``outbox-tui
dead-letter groups``); ``enter`` lists the highlighted group's events
(``GroupEventsScreen``), ``R`` replays its dead letters behind the one confirmation
dialog, which names the count and the types and shows the dedup-window warning when
it applies.

"oldest" and "newest" are the ages of the group's oldest and newest event, from
``created_at``: the outbox stores no failure time, so that is the honest clock.
The line under the table shows the highlighted group in full (every type and
tenant, the error text, the fingerprint for ``dead-letter replay --group``), so
the table stays narrow enough for 80 columns.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable, Static

from engine.errors import OutboxError
from engine.operating.error_groups import ErrorGroup, ErrorGroups
from engine.service import ReplayPlan, error_groups, plan_replay_of_group, replay_of_group
from outbox_tui.screens.base import ConsoleScreen
from outbox_tui.screens.confirm import Confirmation, ConfirmModal
from outbox_tui.screens.dead_letter_actions import replay_body
from outbox_tui.screens.incident_actions import dedup_line, with_warning
from outbox_tui.widgets.footer import ConsoleFooter
from outbox_tui.widgets.format import MUTED_STYLE, age, one_line, timestamp
from outbox_tui.widgets.literal_table import LiteralTable

if TYPE_CHECKING:
    from outbox_tui.app import OutboxConsole


@dataclass
class GroupsLoaded(Message):
    found: ErrorGroups | None
    error: str | None = None


@dataclass
class GroupReplayPrepared(Message):
    fingerprint: str
    plan: ReplayPlan
    warning: Text | None


@dataclass
class GroupReplayFinished(Message):
    text: str
    error: str | None = None


class ErrorGroupsScreen(ConsoleScreen):
    """Failed rows and dead letters grouped by error fingerprint, largest first."""

    BINDINGS = [  # noqa: RUF012 - Textual's declaration style
        Binding("escape", "close", "Back"),
        # priority: the table's own enter (select_cursor, not shown) would hide it
        Binding("enter", "open_group", "Events", id="group-events", priority=True),
        Binding("R", "replay_group", "Replay group", id="replay-group"),
        Binding("ctrl+r", "reload", "Refresh"),
    ]

    def __init__(self, console: OutboxConsole) -> None:
        super().__init__(console, id="error-groups")
        self.found: ErrorGroups | None = None
        self.loads = 0  # groups loaded (tests wait on this)

    def compose(self) -> ComposeResult:
        yield Static("Error groups: loading…", id="groups-title")
        yield LiteralTable(id="groups", cursor_type="row", zebra_stripes=True)
        yield Static("", id="group-summary")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns(
            "count", "dead", "oldest", "newest", "types", "tenants", "error", "fingerprint"
        )
        table.focus()
        self.action_reload()

    def action_close(self) -> None:
        self.app.pop_screen()

    def action_reload(self) -> None:
        self._load()

    @work(exclusive=True, group="groups", exit_on_error=False)
    async def _load(self) -> None:
        console = self.console
        try:
            found = await console.db(error_groups(console.engine))
        except OutboxError as exc:
            self.post_message(GroupsLoaded(None, one_line(exc)))
            return
        self.post_message(GroupsLoaded(found))

    @on(GroupsLoaded)
    def _loaded(self, message: GroupsLoaded) -> None:
        title = self.query_one("#groups-title", Static)
        if message.found is None:
            title.update(f"Error groups: {message.error}")
            return
        self.found = found = message.found
        table = self.query_one(DataTable)
        table.clear()
        now = self.console.clock()
        width = self.app.size.width
        wide = width >= 140
        error_width = 70 if wide else max(16, width - 62)  # what the other columns leave
        for group in found.groups:
            table.add_row(
                f"{group.count:,}",
                f"{group.dead_letters:,}",
                age(group.first_seen, now),
                age(group.last_seen, now),
                _top(group.event_types, 2 if wide else 1, 36 if wide else 22),
                _top(group.tenants, 2 if wide else 1, 24 if wide else 12),
                one_line(group.message, error_width),
                group.fingerprint,
                key=group.fingerprint,
            )
        self._summarise()
        note = "" if found.complete else f" (newest {found.scanned:,} rows only)"
        title.update(
            f"Error groups: {len(found.groups)} from {found.scanned:,} failed and dead-letter "
            f"rows{note} · ages from created_at"
        )
        self.loads += 1

    @on(DataTable.RowHighlighted, "#groups")
    def _summarise(self) -> None:
        """The highlighted group in full under the table: what the narrow columns cut."""
        summary = self.query_one("#group-summary", Static)
        group = self._highlighted_group()
        if group is None:
            summary.update(Text("No failed events or dead letters.", style=MUTED_STYLE))
            return
        summary.update(group_summary(group))

    @on(DataTable.RowSelected, "#groups")
    def _selected(self) -> None:
        self.action_open_group()

    def action_open_group(self) -> None:
        group = self._highlighted_group()
        if group is not None:
            from outbox_tui.screens.group_events import GroupEventsScreen

            self.app.push_screen(GroupEventsScreen(self.console, group))

    def _highlighted_group(self) -> ErrorGroup | None:
        table = self.query_one(DataTable)
        if self.found is None or not self.found.groups or table.row_count == 0:
            return None
        return self.found.groups[min(table.cursor_row, len(self.found.groups) - 1)]

    def _highlighted(self) -> str | None:
        group = self._highlighted_group()
        return group.fingerprint if group is not None else None

    def action_replay_group(self) -> None:
        fingerprint = self._highlighted()
        if fingerprint is not None:
            self._prepare(fingerprint)

    @work(exclusive=True, group="group-replay", exit_on_error=False)
    async def _prepare(self, fingerprint: str) -> None:
        console = self.console
        try:
            plan = await console.db(plan_replay_of_group(console.engine, fingerprint))
            warning = await console.db(dedup_line(console, plan.ids)) if plan.ids else None
        except OutboxError as exc:
            self.post_message(GroupReplayFinished("", one_line(exc)))
            return
        self.post_message(GroupReplayPrepared(fingerprint, plan, warning))

    @on(GroupReplayPrepared)
    def _prepared(self, message: GroupReplayPrepared) -> None:
        if not message.plan.ids:
            self.say("This group has no dead letters (its failed rows retry by themselves).")
            return
        total = message.plan.matched
        body = replay_body(total, message.plan.by_type, f"error group {message.fingerprint}")
        self.app.push_screen(
            ConfirmModal(
                "Replay error group",
                with_warning(body, message.warning),
                confirm_label=f"Replay {total:,}",
                ask_reason=True,
            ),
            lambda decision: self._decided(decision, message.fingerprint),
        )

    def _decided(self, decision: Confirmation | None, fingerprint: str) -> None:
        if decision is None:
            self.say("Replay cancelled; nothing changed.", timeout=3)
            return
        self._replay(fingerprint, decision.reason)

    @work(exclusive=True, group="group-replay", exit_on_error=False)
    async def _replay(self, fingerprint: str, reason: str | None) -> None:
        console = self.console
        try:
            outcome = await console.db(
                replay_of_group(
                    console.engine, fingerprint, operator=console.operator, reason=reason
                )
            )
        except OutboxError as exc:
            self.post_message(GroupReplayFinished("", one_line(exc)))
            return
        text = f"{len(outcome.replayed):,} dead letters back to pending"
        if outcome.refused:
            text += f", {len(outcome.refused):,} refused"
        self.post_message(GroupReplayFinished(text + "."))

    @on(GroupReplayFinished)
    def _finished(self, message: GroupReplayFinished) -> None:
        if message.error:
            self.say(message.error, title="Replay failed", severity="error", timeout=8)
            return
        self.say(message.text, title="Replayed", timeout=5)
        self.action_reload()


def _top(counts: Counter[str], shown: int, width: int) -> str:
    """The most common names, ``+N`` for the others: ``acme +2``."""
    text = ", ".join(name for name, _ in counts.most_common(shown))
    if len(counts) > shown:
        text += f" +{len(counts) - shown}"
    return one_line(text, width)


def _all(counts: Counter[str]) -> str:
    return ", ".join(f"{name} {n:,}" for name, n in counts.most_common())


def group_summary(group: ErrorGroup) -> Text:
    """Every type and tenant of a group, its error text and fingerprint, and when."""
    label = "#8a8a8a"
    return Text.assemble(
        (group.fingerprint, "bold"),
        "  ",
        one_line(group.message),
        "\n",
        ("types ", label),
        _all(group.event_types),
        ("  tenants ", label),
        _all(group.tenants),
        "\n",
        ("created ", label),
        f"{timestamp(group.first_seen)} … {timestamp(group.last_seen)}",
        ("  failed ", label),
        f"{group.statuses.get('failed', 0):,}",
        ("  dead ", label),
        f"{group.dead_letters:,}",
    )
