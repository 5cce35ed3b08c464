"""The main screen: overview, dispatchers, the event list and the detail pane.

Data flow: a timer starts an exclusive ``poll`` worker; the worker asks
``OutboxInsights`` and posts ``PollSucceeded`` / ``PollFailed``; the handlers
update the widgets. The next poll is scheduled only after the previous one
finished, so polls never overlap, and polling pauses while a dialog is open.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.coordinate import Coordinate
from textual.notifications import SeverityLevel
from textual.reactive import reactive
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Static
from textual.worker import Worker, WorkerState

from engine.errors import OutboxError
from engine.insights import BlockedKey, EventFilter, EventPage, EventSummary, OverviewSnapshot
from engine.replay import replay_dead_letter, skip_dead_letter
from engine.schema import DEAD_LETTER, PUBLISHED
from outbox_tui.actions import bindings
from outbox_tui.dispatch_control import DispatchExit, describe_summary
from outbox_tui.messages import (
    ActionFailed,
    BlockedPage,
    DetailLoaded,
    DispatchChanged,
    PageLoaded,
    PollFailed,
    PollSucceeded,
    ReplayFinished,
    ReplayPrepared,
    SkipFinished,
    SkipPrepared,
    ViewPage,
)
from outbox_tui.screens.confirm import Confirmation, ConfirmModal
from outbox_tui.screens.filter import FilterModal
from outbox_tui.screens.palette import ConsoleCommands
from outbox_tui.widgets.blocked_keys import BlockedKeysTable
from outbox_tui.widgets.dispatchers import DispatchersPanel
from outbox_tui.widgets.event_detail import EventDetailPane
from outbox_tui.widgets.event_table import EventTable
from outbox_tui.widgets.format import one_line, short_id, timestamp
from outbox_tui.widgets.overview import OverviewPanel
from outbox_tui.widgets.status_bar import StatusBar

if TYPE_CHECKING:
    from outbox_tui.app import OutboxConsole

EVENTS, DEAD_LETTERS, BLOCKED = "events", "dead_letters", "blocked_keys"
REPLAY_CHUNK = 500
THROUGHPUT_POINTS = 60
FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Target:
    """The event an action applies to: the highlighted event, or the highlighted key's head."""

    id: str
    status: str
    kind: str  # "orders.placed v1" (the blocked-keys view knows no version: the type alone)
    ordering_key: str | None

    @classmethod
    def of_event(cls, event: EventSummary) -> Target:
        kind = f"{event.event_type} v{event.event_version}"
        return cls(event.id, event.status, kind, event.ordering_key)

    @classmethod
    def of_key(cls, key: BlockedKey) -> Target:
        return cls(key.head_id, key.head_status, key.head_event_type, key.ordering_key)


@dataclass(slots=True)
class ViewState:
    """What one view (events or dead letters) shows: its filter and where it is paging."""

    mode: str
    filter: EventFilter = field(default_factory=EventFilter)
    cursors: list[str | None] = field(default_factory=lambda: [None])
    has_more: bool = False

    @property
    def before(self) -> str | None:
        return self.cursors[-1]

    @property
    def page_number(self) -> int:
        return len(self.cursors)

    @property
    def query_filter(self) -> EventFilter:
        if self.mode == DEAD_LETTERS:
            return replace(self.filter, statuses=(DEAD_LETTER,))
        return self.filter

    def describe(self) -> str:
        if self.mode == BLOCKED:
            return "held back by a failed or dead-lettered head"
        if self.mode == DEAD_LETTERS:
            rest = replace(self.filter, statuses=())
            return "all dead letters" if rest == EventFilter() else rest.describe()
        return self.filter.describe()


def _events(n: int) -> str:
    return f"{n:,} waiting event{'' if n == 1 else 's'}"


def skip_body(message: SkipPrepared) -> Text:
    """What the skip releases: the dead letter, its key, and how many events wait behind it."""
    text = Text.assemble(
        "Skip dead letter ",
        (short_id(message.event_id), "bold"),
        f" ({message.kind})?\n\n",
        ("  ordering key  ", "#8a8a8a"),
        (message.ordering_key, "bold"),
        "\n",
        ("  releases      ", "#8a8a8a"),
        (_events(message.waiting), "bold #ffaf5f" if message.waiting else "bold"),
        "\n",
    )
    text.append(
        "\nIt stays in the dead letter; the events of its key go on without it. A replay "
        "later sends it to the back of its key. The skip is written to the audit log.",
        style="#8a8a8a",
    )
    return text


def replay_body(total: int, by_type: Mapping[str, int], scope: str) -> Text:
    """``Replay 3 dead letters …`` with one line per event type."""
    noun = "dead letter" if total == 1 else "dead letters"
    text = Text.assemble("Replay ", (f"{total:,} {noun}", "bold"), f" ({scope}):\n")
    for event_type, n in list(by_type.items())[:8]:
        text.append(f"  • {event_type} ", style="bold")
        text.append(f"× {n:,}\n")
    if len(by_type) > 8:
        text.append(f"  • … and {len(by_type) - 8} more types\n", style="#8a8a8a")
    text.append(
        "\nThey go back to pending with a fresh attempt budget; the dispatcher picks them "
        "up. Each replay is written to the replay audit log.",
        style="#8a8a8a",
    )
    return text


class MainScreen(Screen[None]):
    """Everything on one screen; the bindings here are the console's verbs."""

    COMMANDS = {ConsoleCommands}  # noqa: RUF012 - Textual's declaration style
    BINDINGS = bindings(app=False)

    mode: reactive[str] = reactive(EVENTS, bindings=True)
    detail_open: reactive[bool] = reactive(False, bindings=True)
    dispatch_state: reactive[str] = reactive("stopped", bindings=True)
    connection: reactive[str] = reactive("connecting")

    def __init__(self) -> None:
        super().__init__(id="main")
        self.views = {
            EVENTS: ViewState(EVENTS),
            DEAD_LETTERS: ViewState(DEAD_LETTERS),
            BLOCKED: ViewState(BLOCKED),
        }
        self.refreshes = 0  # successful polls applied (tests wait on this)
        self.pages = 0  # pages loaded by navigation (filter, view, paging)
        self.failures = 0  # consecutive failed polls
        self.last_snapshot: OverviewSnapshot | None = None
        self.throughput: deque[int] = deque(maxlen=THROUGHPUT_POINTS)
        self._last_published: int | None = None
        self._generation = 0
        self._poll_timer: Timer | None = None
        self._poll_waiting = False
        self._deferred: PollSucceeded | None = None
        self._last_good: datetime | None = None

    @property
    def console_app(self) -> OutboxConsole:
        return self.app  # type: ignore[return-value]

    @property
    def view(self) -> ViewState:
        return self.views[self.mode]

    # -- layout -------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        config = self.console_app.config
        yield StatusBar(self.console_app.display_url, config.refresh_seconds, id="status-bar")
        yield Static("", id="banner")
        yield OverviewPanel(config.pending_age, id="overview")
        yield DispatchersPanel(id="dispatchers")
        with Horizontal(id="body"):
            with Vertical(id="list"):
                yield EventTable(id="events")
                yield BlockedKeysTable(id="blocked-keys")
                yield Static("", id="empty-list")
            yield EventDetailPane(id="detail")
        yield Footer()

    def on_mount(self) -> None:
        self.console_app.dispatch.on_exit = self._dispatch_exited
        self._update_titles(None)
        self.query_one(BlockedKeysTable).display = False
        self.query_one(EventTable).focus()
        self.poll_now()
        if self.console_app.config.autostart_dispatch:
            self.action_start_dispatch()

    # -- polling ------------------------------------------------------------------------

    def poll_now(self) -> None:
        """Refresh at once (cancelling a poll in flight); the timer restarts after it."""
        if self._poll_timer is not None:
            self._poll_timer.stop()
            self._poll_timer = None
        self._poll_waiting = False
        self._poll(self._generation)

    def _schedule_poll(self) -> None:
        if self._poll_timer is not None:
            self._poll_timer.stop()
        self._poll_timer = self.set_timer(self.console_app.config.refresh_seconds, self._poll_due)

    def _poll_due(self) -> None:
        self._poll_timer = None
        if self.is_active:
            self.poll_now()
        else:
            self._poll_waiting = True  # a dialog is open: resume when it closes

    def on_screen_resume(self, _event: events.ScreenResume) -> None:
        if self._deferred is not None:
            deferred, self._deferred = self._deferred, None
            self._apply_poll(deferred)
        if self._poll_waiting:
            self.poll_now()

    @work(exclusive=True, group="poll", exit_on_error=False)
    async def _poll(self, generation: int) -> None:
        view = self.view
        insights = self.console_app.insights
        db = self.console_app.db
        timeout = self.console_app.config.poll_timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                snapshot = await db(insights.overview())
                page = await self._fetch(view)
        except TimeoutError:
            self.post_message(PollFailed(f"the database did not answer within {timeout:g}s"))
        except OutboxError as exc:
            self.post_message(PollFailed(one_line(exc)))
        else:
            self.post_message(PollSucceeded(snapshot, page, generation))
        self._schedule_poll()

    async def _fetch(self, view: ViewState) -> ViewPage:
        """The rows ``view`` shows now: a page of events, or the blocked keys."""
        console = self.console_app
        if view.mode == BLOCKED:
            keys = await console.db(console.insights.blocked_keys(limit=console.config.page_size))
            return BlockedPage(tuple(keys))
        return await console.db(
            console.insights.events_page(
                view.query_filter, limit=console.config.page_size, before=view.before
            )
        )

    @on(PollSucceeded)
    def _poll_succeeded(self, message: PollSucceeded) -> None:
        if not self.is_active:
            self._deferred = message  # redraws wait until the dialog closes
            return
        self._apply_poll(message)

    def _apply_poll(self, message: PollSucceeded) -> None:
        snap = message.snapshot
        if self.connection == "lost":
            self.say("The database answers again.", title="Reconnected", timeout=4)
        self.connection = "connected"
        self.failures = 0
        self._last_good = snap.taken_at
        published = snap.counts.get(PUBLISHED, 0)
        if self._last_published is not None:
            self.throughput.append(max(0, published - self._last_published))
        self._last_published = published
        self.last_snapshot = snap
        self.query_one(OverviewPanel).show(snap, list(self.throughput))
        self.query_one(DispatchersPanel).show(snap.heartbeats)
        if message.generation == self._generation:
            self._show_page(message.page, snap.taken_at)
        self.refreshes += 1
        if self.detail_open:
            self.load_detail()

    def _show_page(self, page: ViewPage, now: datetime) -> None:
        view = self.view
        empty = self.query_one("#empty-list", Static)
        if isinstance(page, BlockedPage):
            view.has_more = False
            self.query_one(BlockedKeysTable).show(page.keys)
            empty.display = not page.keys
            empty.update(
                Content(
                    "No blocked keys: no ordering key is held back by a failed or "
                    "dead-lettered event."
                )
            )
        else:
            view.has_more = page.has_more
            table = self.query_one(EventTable)
            table.show(self.mode, page.events, now, follow_head=not self.detail_open)
            empty.display = not page.events
            if not page.events:
                what = "dead letters" if self.mode == DEAD_LETTERS else "events"
                described = view.describe()
                hint = "" if described.startswith("all ") else " Press / to change the filter."
                empty.update(Content(f"No {what} match {described}.{hint}"))
        self._update_titles(page)
        self.refresh_bindings()

    def _update_titles(self, page: ViewPage | None) -> None:
        view = self.view
        box = self.query_one("#list", Vertical)
        if self.mode == BLOCKED:
            box.border_title = Content(f"Blocked keys · {view.describe()} · oldest head first")
            if not isinstance(page, BlockedPage):
                box.border_subtitle = ""
                return
            total = self.last_snapshot.blocked_keys if self.last_snapshot else len(page.keys)
            shown = f"{len(page.keys)} shown" + (f" of {total:,}" if total > len(page.keys) else "")
            hints = ["enter head detail", "w its events", "k skip", "r replay"]
            box.border_subtitle = Content(" · ".join([shown, *hints]))
            return
        name = "Dead letters" if self.mode == DEAD_LETTERS else "Events"
        box.border_title = Content(
            f"{name} · {view.describe()} · page {view.page_number}, newest first"
        )
        if not isinstance(page, EventPage):
            box.border_subtitle = ""
            return
        hints = []
        if view.page_number > 1:
            hints.append("[ newer")
        if page.has_more:
            hints.append("] older")
        box.border_subtitle = Content(" · ".join([f"{len(page.events)} shown", *hints]))

    @on(PollFailed)
    def _poll_failed(self, message: PollFailed) -> None:
        first = self.connection != "lost"
        self.connection = "lost"
        self.failures += 1
        since = ""
        if self._last_good is not None:
            since = f" Figures below are from {timestamp(self._last_good)}."
        self.query_one("#banner", Static).update(
            Text.assemble(
                (" ⚠ Database problem: ", "bold"),
                message.error,
                (
                    f"  Retrying every {self.console_app.config.refresh_seconds:g}s "
                    f"(attempt {self.failures}).{since}",
                    "",
                ),
            )
        )
        if first:
            self.say(message.error, title="Database problem", severity="error", timeout=6)

    def watch_connection(self, connection: str) -> None:
        self.query_one(StatusBar).connection = connection
        self.query_one("#banner").set_class(connection == "lost", "-visible")
        for selector in ("#overview", "#dispatchers", "#list"):
            self.query_one(selector).set_class(connection == "lost", "-stale")

    # -- views, paging, filter ----------------------------------------------------------

    def _view_changed(self) -> None:
        """Filter, view or page changed: load just that page now (the counts can wait)."""
        self._generation += 1
        self._update_titles(None)
        self._load_page(self._generation)

    @work(exclusive=True, group="page", exit_on_error=False)
    async def _load_page(self, generation: int) -> None:
        try:
            page = await self._fetch(self.view)
        except OutboxError as exc:
            self.post_message(PollFailed(one_line(exc)))
        else:
            self.post_message(PageLoaded(page, generation))

    @on(PageLoaded)
    def _page_loaded(self, message: PageLoaded) -> None:
        if message.generation != self._generation:
            return  # the operator moved on; a newer load is on its way
        snap = self.last_snapshot
        self._show_page(message.page, snap.taken_at if snap else self.console_app.clock())
        self.pages += 1

    def action_show_events(self) -> None:
        self._switch(EVENTS)

    def action_show_dead_letters(self) -> None:
        self._switch(DEAD_LETTERS)

    def action_show_blocked_keys(self) -> None:
        self._switch(BLOCKED)

    def action_show_key_events(self) -> None:
        """The undelivered events of the highlighted key (or event's key), in the events view."""
        target = self._target()
        if target is None or target.ordering_key is None:
            return
        view = self.views[EVENTS]
        view.filter = EventFilter(ordering_key=target.ordering_key)
        view.cursors = [None]
        view.has_more = False
        if self.mode == EVENTS:
            self._view_changed()
        else:
            self._switch(EVENTS)

    def _switch(self, mode: str) -> None:
        if self.mode != mode:
            self.mode = mode
            blocked = mode == BLOCKED
            self.query_one(EventTable).display = not blocked
            self.query_one(BlockedKeysTable).display = blocked
            self._view_changed()
        self._list_table().focus()

    def _list_table(self) -> EventTable | BlockedKeysTable:
        if self.mode == BLOCKED:
            return self.query_one(BlockedKeysTable)
        return self.query_one(EventTable)

    def action_older_page(self) -> None:
        table = self.query_one(EventTable)
        if self.mode == BLOCKED or not self.view.has_more or table.row_count == 0:
            return
        last = table.coordinate_to_cell_key(Coordinate(table.row_count - 1, 0)).row_key.value
        self.view.cursors.append(last)
        self.view.has_more = False
        self._view_changed()
        table.move_cursor(row=0)

    def action_newer_page(self) -> None:
        if self.view.page_number > 1:
            self.view.cursors.pop()
            self._view_changed()

    def action_first_page(self) -> None:
        if self.view.page_number > 1:
            self.view.cursors = [None]
            self._view_changed()
        self._list_table().move_cursor(row=0)

    def action_filter(self) -> None:
        if self.mode == BLOCKED:
            return
        known_types = [t for t, _v in self.console_app.registry.event_types()]
        table = self.query_one(EventTable)
        seen = [e.event_type for e in table.events]
        tenants = [e.tenant_id for e in table.events]
        keys = [e.ordering_key for e in table.events if e.ordering_key]
        keys += [k.ordering_key for k in self.query_one(BlockedKeysTable).blocked_keys]
        self.app.push_screen(
            FilterModal(
                self.view.filter,
                dead_letters_only=self.mode == DEAD_LETTERS,
                event_types=[*known_types, *seen],
                tenants=tenants,
                ordering_keys=keys,
            ),
            self._filter_chosen,
        )

    def _filter_chosen(self, flt: EventFilter | None) -> None:
        if flt is None:
            return
        self.set_filter(flt)

    def set_filter(self, flt: EventFilter) -> None:
        if self.mode == BLOCKED:
            return
        view = self.view
        view.filter = replace(flt, statuses=()) if self.mode == DEAD_LETTERS else flt
        view.cursors = [None]
        view.has_more = False
        self._view_changed()

    def action_clear_filter(self) -> None:
        self.set_filter(EventFilter())

    def action_refresh_now(self) -> None:
        self.poll_now()

    # -- detail -------------------------------------------------------------------------

    @on(DataTable.RowSelected, "#events, #blocked-keys")
    def _row_selected(self) -> None:
        self.action_open_detail()

    def action_open_detail(self) -> None:
        if self.detail_open:
            self.query_one(EventDetailPane).focus()
            return
        self.detail_open = True

    def watch_detail_open(self, is_open: bool) -> None:
        self.query_one("#body").set_class(is_open, "-detail-open")
        if is_open:
            self.load_detail()
        else:
            self._list_table().focus()

    def action_close_detail(self) -> None:
        self.detail_open = False

    @on(DataTable.RowHighlighted, "#events, #blocked-keys")
    def _row_highlighted(self) -> None:
        self.refresh_bindings()
        target = self._target()
        pane = self.query_one(EventDetailPane)
        if self.detail_open and target is not None and target.id != pane.event_id:
            self.load_detail()

    def load_detail(self) -> None:
        target = self._target()
        pane = self.query_one(EventDetailPane)
        if target is None:
            pane.event_id = None
            pane.show_message("No event highlighted." if self.mode != BLOCKED else "No key.")
            return
        self._load_detail(target.id)

    @work(exclusive=True, group="detail", exit_on_error=False)
    async def _load_detail(self, event_id: str) -> None:
        insights, db = self.console_app.insights, self.console_app.db
        try:
            detail = await db(insights.event_detail(event_id))
            waiting = None
            columns = detail.columns
            if columns.get("ordering_key") and columns.get("status") in (DEAD_LETTER, FAILED):
                waiting = await db(insights.waiting_behind(event_id))
        except OutboxError as exc:
            self.post_message(DetailLoaded(event_id, None, one_line(exc)))
        else:
            self.post_message(DetailLoaded(event_id, detail, None, waiting))

    @on(DetailLoaded)
    def _detail_loaded(self, message: DetailLoaded) -> None:
        pane = self.query_one(EventDetailPane)
        target = self._target()
        if target is None or target.id != message.event_id:
            return  # the cursor moved on; its own load is on the way
        if message.detail is None:
            pane.event_id = message.event_id
            pane.show_message(message.error or "unknown error", error=True)
            return
        pane.show(message.detail, self.console_app.clock(), waiting=message.waiting)

    # -- replay -------------------------------------------------------------------------

    def action_replay_one(self) -> None:
        target = self._target()
        if target is None or target.status != DEAD_LETTER:
            return
        self.app.push_screen(
            ConfirmModal(
                "Replay dead letter",
                replay_body(1, {target.kind: 1}, f"event {short_id(target.id)}"),
                confirm_label="Replay",
                ask_reason=True,
            ),
            lambda decision: self._replay_decided(decision, (target.id,)),
        )

    def action_replay_matching(self) -> None:
        view = self.view
        if view.mode == BLOCKED:
            return
        if view.mode == EVENTS and view.filter.statuses and DEAD_LETTER not in view.filter.statuses:
            self.say(
                f"The filter ({view.describe()}) matches no dead letters: press d, or widen it.",
                title="Nothing to replay",
                severity="warning",
            )
            return
        self._prepare_replay(replace(view.filter, statuses=(DEAD_LETTER,)))

    @work(exclusive=True, group="replay", exit_on_error=False)
    async def _prepare_replay(self, flt: EventFilter) -> None:
        try:
            summary = await self.console_app.db(self.console_app.insights.match_events(flt))
        except OutboxError as exc:
            self.post_message(ActionFailed("Replay", one_line(exc)))
            return
        self.post_message(ReplayPrepared(flt, summary.total, dict(summary.by_type), summary.ids))

    @on(ReplayPrepared)
    def _replay_prepared(self, message: ReplayPrepared) -> None:
        flt = message.filter
        scope = replace(flt, statuses=()).describe()
        scope = "every dead letter" if scope == "all events" else f"matching {scope}"
        if message.total == 0:
            self.say(f"No dead letters ({scope}).", title="Nothing to replay")
            return
        self.app.push_screen(
            ConfirmModal(
                "Replay dead letters",
                replay_body(message.total, message.by_type, scope),
                confirm_label=f"Replay {message.total:,}",
                ask_reason=True,
            ),
            lambda decision: self._replay_decided(decision, message.ids),
        )

    def _replay_decided(self, decision: Confirmation | None, ids: Sequence[str]) -> None:
        if decision is None:
            self.say("Replay cancelled; nothing changed.", timeout=3)
            return
        self._replay(tuple(ids), decision.reason)

    @work(exclusive=True, group="replay", exit_on_error=False)
    async def _replay(self, ids: tuple[str, ...], reason: str | None) -> None:
        """Replay exactly the ids the operator confirmed (never rows that arrived since)."""
        console = self.console_app
        try:
            replayed = 0
            refused: dict[str, str] = {}
            for start in range(0, len(ids), REPLAY_CHUNK):
                result = await console.db(
                    replay_dead_letter(
                        console.engine,
                        ids[start : start + REPLAY_CHUNK],
                        operator=console.operator,
                        reason=reason,
                        strict=False,
                    )
                )
                replayed += len(result.replayed)
                refused.update(result.refused)
        except OutboxError as exc:
            self.post_message(ReplayFinished(0, {}, one_line(exc)))
            return
        self.post_message(ReplayFinished(replayed, refused))

    @on(ReplayFinished)
    def _replay_finished(self, message: ReplayFinished) -> None:
        if message.error:
            self.say(message.error, title="Replay failed", severity="error", timeout=8)
            return
        noun = "dead letter" if message.replayed == 1 else "dead letters"
        text = f"{message.replayed:,} {noun} back to pending."
        if message.refused:
            why = next(iter(message.refused.values()))
            self.say(
                f"{text} {len(message.refused):,} refused ({why}).",
                title="Replay partly done",
                severity="warning",
                timeout=8,
            )
        else:
            self.say(text, title="Replayed", timeout=5)
        self.poll_now()

    # -- skip ---------------------------------------------------------------------------

    def action_skip_dead_letter(self) -> None:
        """Release the key a dead letter holds back, after a confirmation naming what waits."""
        target = self._target()
        if target is None or target.status != DEAD_LETTER or target.ordering_key is None:
            return  # the binding is disabled then (check_action)
        self._prepare_skip(target)

    @work(exclusive=True, group="skip", exit_on_error=False)
    async def _prepare_skip(self, target: Target) -> None:
        """Count what waits behind it now, so the confirmation can say what a skip releases."""
        insights, db = self.console_app.insights, self.console_app.db
        try:
            detail = await db(insights.event_detail(target.id))
            waiting = await db(insights.waiting_behind(target.id))
        except OutboxError as exc:
            self.post_message(ActionFailed("Skip", one_line(exc)))
            return
        columns = detail.columns
        if columns.get("status") != DEAD_LETTER:
            status = str(columns.get("status")).replace("_", " ")
            self.post_message(ActionFailed("Skip", f"it is {status} now, not a dead letter"))
        elif columns.get("skipped_at") is not None:
            self.post_message(ActionFailed("Skip", "it was skipped already; its key goes on"))
        else:
            key = str(columns.get("ordering_key") or target.ordering_key)
            self.post_message(SkipPrepared(target.id, target.kind, key, waiting))

    @on(SkipPrepared)
    def _skip_prepared(self, message: SkipPrepared) -> None:
        self.app.push_screen(
            ConfirmModal(
                "Skip dead letter",
                skip_body(message),
                confirm_label="Skip",
                ask_reason=True,
                reason_placeholder="why (kept in the audit log)",
            ),
            lambda decision: self._skip_decided(decision, message),
        )

    def _skip_decided(self, decision: Confirmation | None, message: SkipPrepared) -> None:
        if decision is None:
            self.say("Skip cancelled; nothing changed.", timeout=3)
            return
        self._skip(message, decision.reason)

    @work(exclusive=True, group="skip", exit_on_error=False)
    async def _skip(self, message: SkipPrepared, reason: str | None) -> None:
        console = self.console_app
        event_id, key = message.event_id, message.ordering_key
        try:
            result = await console.db(
                skip_dead_letter(
                    console.engine,
                    [event_id],
                    operator=console.operator,
                    reason=reason,
                    strict=False,
                )
            )
        except OutboxError as exc:
            self.post_message(SkipFinished(event_id, key, message.waiting, error=one_line(exc)))
            return
        refused = result.refused.get(event_id)
        self.post_message(SkipFinished(event_id, key, message.waiting, refused=refused))

    @on(SkipFinished)
    def _skip_finished(self, message: SkipFinished) -> None:
        if message.error:
            self.say(message.error, title="Skip failed", severity="error", timeout=8)
            return
        if message.refused:
            self.say(
                f"{short_id(message.event_id)} was not skipped: {message.refused}.",
                title="Not skipped",
                severity="warning",
                timeout=8,
            )
            return
        self.say(
            f"{short_id(message.event_id)} skipped: {_events(message.waiting)} of "
            f"{message.ordering_key} released.",
            title="Skipped",
            timeout=5,
        )
        self.poll_now()

    # -- dispatch -----------------------------------------------------------------------

    def action_start_dispatch(self) -> None:
        control = self.console_app.dispatch
        reason = control.unavailable_reason()
        if reason:
            self.say(reason, title="Cannot start dispatch", severity="warning", timeout=10)
            return
        self.dispatch_state = "starting"
        self._start_dispatch()

    @work(exclusive=True, group="dispatch", exit_on_error=False)
    async def _start_dispatch(self) -> None:
        control = self.console_app.dispatch
        try:
            await control.start()
        except OutboxError as exc:
            self.post_message(DispatchChanged(False, error=one_line(exc)))
            return
        self.post_message(DispatchChanged(True, note=f"{control.instance_id} → {control.target}"))

    def action_stop_dispatch(self) -> None:
        self.app.push_screen(
            ConfirmModal(
                "Stop dispatch",
                Text(
                    "Stop the console's dispatcher? It finishes the batch it holds, marks its "
                    "heartbeat stopped and exits. Other dispatchers are not affected."
                ),
                confirm_label="Stop",
            ),
            self._stop_decided,
        )

    def _stop_decided(self, decision: Confirmation | None) -> None:
        if decision is None:
            return
        self.dispatch_state = "stopping"
        self._stop_dispatch()

    @work(exclusive=True, group="dispatch", exit_on_error=False)
    async def _stop_dispatch(self) -> None:
        outcome = await self.console_app.dispatch.stop()
        if outcome is None:
            self.post_message(DispatchChanged(False))
            return
        self.post_message(
            DispatchChanged(False, note=describe_summary(outcome.summary), error=outcome.error)
        )

    def _dispatch_exited(self, outcome: DispatchExit) -> None:
        """The loop ended by itself (a crash, or a storage error it gave up on)."""
        if not outcome.requested:
            error = outcome.error or "the dispatch loop ended by itself"
            self.post_message(DispatchChanged(False, error=error))

    @on(DispatchChanged)
    def _dispatch_changed(self, message: DispatchChanged) -> None:
        self.dispatch_state = "running" if message.running else "stopped"
        if message.error:
            title = "Dispatch failed" if not message.running else "Dispatch"
            self.say(message.error, title=title, severity="error", timeout=10)
        elif message.running:
            self.say(message.note, title="Dispatch started", timeout=4)
        else:
            self.say(message.note or "stopped", title="Dispatch stopped", timeout=4)
        self.poll_now()

    def watch_dispatch_state(self, state: str) -> None:
        bar = self.query_one(StatusBar)
        bar.dispatch = state
        bar.dispatch_target = self.console_app.dispatch.target

    # -- errors and bindings ------------------------------------------------------------

    def say(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float = 5.0,
    ) -> None:
        """A toast; the text is shown as is (error messages are not markup)."""
        self.notify(message, title=title, severity=severity, timeout=timeout, markup=False)

    @on(ActionFailed)
    def _action_failed(self, message: ActionFailed) -> None:
        self.say(message.error, title=f"{message.what} failed", severity="error", timeout=8)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place an unexpected worker failure is turned into something visible."""
        if event.state != WorkerState.ERROR:
            return
        error = event.worker.error
        self.say(
            f"{type(error).__name__}: {error}",
            title=f"Unexpected error in {event.worker.group}",
            severity="error",
            timeout=10,
        )
        if event.worker.group == "poll":
            self._schedule_poll()
        elif event.worker.group == "dispatch":
            self.dispatch_state = "running" if self.console_app.dispatch.running else "stopped"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        state = self.dispatch_state
        if action == "start_dispatch":
            if state in ("running", "stopping"):
                return False
            return None if state == "starting" else True
        if action == "stop_dispatch":
            if state in ("stopped", "starting"):
                return False
            return None if state == "stopping" else True
        target = self._target() if action in _ON_TARGET else None
        if action == "replay_one":
            return True if target is not None and target.status == DEAD_LETTER else None
        if action == "skip_dead_letter":  # shown only where it applies: the footer is full
            keyed = target is not None and target.ordering_key is not None
            return keyed and target is not None and target.status == DEAD_LETTER
        if action == "show_key_events":
            return True if target is not None and target.ordering_key is not None else None
        if action == "close_detail":
            return self.detail_open
        if self.mode == BLOCKED and action in _NOT_FOR_KEYS:
            return False  # not offered (nor shown) in the blocked-keys view
        if action == "older_page":  # paging keys show while there is somewhere to go
            return self.view.has_more
        if action == "newer_page":
            return self.view.page_number > 1
        return True

    def _target(self) -> Target | None:
        """What ``r``, ``k``, ``w`` and the detail act on in the current view."""
        try:
            if self.mode == BLOCKED:
                key = self.query_one(BlockedKeysTable).highlighted
                return Target.of_key(key) if key is not None else None
            event = self.query_one(EventTable).highlighted
        except Exception:  # before compose
            return None
        return Target.of_event(event) if event is not None else None


_ON_TARGET = ("replay_one", "skip_dead_letter", "show_key_events")
# The blocked-keys view has no filter and no pages (it lists the oldest heads).
_NOT_FOR_KEYS = ("filter", "replay_matching", "older_page", "newer_page")
