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
from textual.binding import Binding
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
from engine.insights import EventFilter, EventPage, EventSummary, OverviewSnapshot
from engine.replay import replay_dead_letter
from engine.schema import DEAD_LETTER, PUBLISHED
from outbox_tui.dispatch_control import DispatchExit, describe_summary
from outbox_tui.messages import (
    ActionFailed,
    DetailLoaded,
    DispatchChanged,
    PageLoaded,
    PollFailed,
    PollSucceeded,
    ReplayFinished,
    ReplayPrepared,
)
from outbox_tui.screens.confirm import Confirmation, ConfirmModal
from outbox_tui.screens.filter import FilterModal
from outbox_tui.screens.palette import ConsoleCommands
from outbox_tui.widgets.dispatchers import DispatchersPanel
from outbox_tui.widgets.event_detail import EventDetailPane
from outbox_tui.widgets.event_table import EventTable
from outbox_tui.widgets.format import one_line, short_id, timestamp
from outbox_tui.widgets.overview import OverviewPanel
from outbox_tui.widgets.status_bar import StatusBar

if TYPE_CHECKING:
    from outbox_tui.app import OutboxConsole

EVENTS, DEAD_LETTERS = "events", "dead_letters"
REPLAY_CHUNK = 500
THROUGHPUT_POINTS = 60


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
        if self.mode == DEAD_LETTERS:
            rest = replace(self.filter, statuses=())
            return "all dead letters" if rest == EventFilter() else rest.describe()
        return self.filter.describe()


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
    BINDINGS = [  # noqa: RUF012 - Textual's declaration style
        Binding("e", "show_events", "Events", id="events"),
        Binding("d", "show_dead_letters", "Dead letters", id="dead-letters"),
        Binding("slash", "filter", "Filter", id="filter"),
        Binding("r", "replay_one", "Replay", id="replay"),
        Binding("R", "replay_matching", "Replay all", id="replay-all"),
        Binding("s", "start_dispatch", "Start dispatch", id="start-dispatch"),
        Binding("s", "stop_dispatch", "Stop dispatch", id="stop-dispatch"),
        Binding("right_square_bracket", "older_page", "Older", id="older"),
        Binding("left_square_bracket", "newer_page", "Newer", id="newer"),
        Binding("home", "first_page", "Newest", show=False),
        Binding("escape", "close_detail", "Close detail", id="close-detail"),
        Binding("ctrl+r", "refresh_now", "Refresh", show=False),
    ]

    mode: reactive[str] = reactive(EVENTS, bindings=True)
    detail_open: reactive[bool] = reactive(False, bindings=True)
    dispatch_state: reactive[str] = reactive("stopped", bindings=True)
    connection: reactive[str] = reactive("connecting")

    def __init__(self) -> None:
        super().__init__(id="main")
        self.views = {EVENTS: ViewState(EVENTS), DEAD_LETTERS: ViewState(DEAD_LETTERS)}
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
                yield Static("", id="empty-list")
            yield EventDetailPane(id="detail")
        yield Footer()

    def on_mount(self) -> None:
        self.console_app.dispatch.on_exit = self._dispatch_exited
        self._update_titles(None)
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
                page = await db(
                    insights.events_page(
                        view.query_filter,
                        limit=self.console_app.config.page_size,
                        before=view.before,
                    )
                )
        except TimeoutError:
            self.post_message(PollFailed(f"the database did not answer within {timeout:g}s"))
        except OutboxError as exc:
            self.post_message(PollFailed(one_line(exc)))
        else:
            self.post_message(PollSucceeded(snapshot, page, generation))
        self._schedule_poll()

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

    def _show_page(self, page: EventPage, now: datetime) -> None:
        view = self.view
        view.has_more = page.has_more
        table = self.query_one(EventTable)
        table.show(self.mode, page.events, now, follow_head=not self.detail_open)
        empty = self.query_one("#empty-list", Static)
        if page.events:
            empty.display = False
        else:
            empty.display = True
            what = "dead letters" if self.mode == DEAD_LETTERS else "events"
            hint = "" if view.describe().startswith("all ") else " Press / to change the filter."
            empty.update(Content(f"No {what} match {view.describe()}.{hint}"))
        self._update_titles(page)
        self.refresh_bindings()

    def _update_titles(self, page: EventPage | None) -> None:
        view = self.view
        box = self.query_one("#list", Vertical)
        name = "Dead letters" if self.mode == DEAD_LETTERS else "Events"
        box.border_title = Content(
            f"{name} · {view.describe()} · page {view.page_number}, newest first"
        )
        if page is None:
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
        view, console = self.view, self.console_app
        try:
            page = await console.db(
                console.insights.events_page(
                    view.query_filter, limit=console.config.page_size, before=view.before
                )
            )
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

    def _switch(self, mode: str) -> None:
        self.query_one(EventTable).focus()
        if self.mode == mode:
            return
        self.mode = mode
        self._view_changed()

    def action_older_page(self) -> None:
        table = self.query_one(EventTable)
        if not self.view.has_more or table.row_count == 0:
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
        self.query_one(EventTable).move_cursor(row=0)

    def action_filter(self) -> None:
        known_types = [t for t, _v in self.console_app.registry.event_types()]
        table = self.query_one(EventTable)
        seen = [e.event_type for e in table.events]
        tenants = [e.tenant_id for e in table.events]
        self.app.push_screen(
            FilterModal(
                self.view.filter,
                dead_letters_only=self.mode == DEAD_LETTERS,
                event_types=[*known_types, *seen],
                tenants=tenants,
            ),
            self._filter_chosen,
        )

    def _filter_chosen(self, flt: EventFilter | None) -> None:
        if flt is None:
            return
        self.set_filter(flt)

    def set_filter(self, flt: EventFilter) -> None:
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

    @on(DataTable.RowSelected, "#events")
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
            self.query_one(EventTable).focus()

    def action_close_detail(self) -> None:
        self.detail_open = False

    @on(DataTable.RowHighlighted, "#events")
    def _row_highlighted(self) -> None:
        self.refresh_bindings()
        event = self.query_one(EventTable).highlighted
        pane = self.query_one(EventDetailPane)
        if self.detail_open and event is not None and event.id != pane.event_id:
            self.load_detail()

    def load_detail(self) -> None:
        event = self.query_one(EventTable).highlighted
        pane = self.query_one(EventDetailPane)
        if event is None:
            pane.event_id = None
            pane.show_message("No event highlighted.")
            return
        self._load_detail(event.id)

    @work(exclusive=True, group="detail", exit_on_error=False)
    async def _load_detail(self, event_id: str) -> None:
        try:
            detail = await self.console_app.db(self.console_app.insights.event_detail(event_id))
        except OutboxError as exc:
            self.post_message(DetailLoaded(event_id, None, one_line(exc)))
        else:
            self.post_message(DetailLoaded(event_id, detail, None))

    @on(DetailLoaded)
    def _detail_loaded(self, message: DetailLoaded) -> None:
        pane = self.query_one(EventDetailPane)
        highlighted = self.query_one(EventTable).highlighted
        if highlighted is None or highlighted.id != message.event_id:
            return  # the cursor moved on; its own load is on the way
        if message.detail is None:
            pane.event_id = message.event_id
            pane.show_message(message.error or "unknown error", error=True)
            return
        pane.show(message.detail, self.console_app.clock())

    # -- replay -------------------------------------------------------------------------

    def action_replay_one(self) -> None:
        event = self.query_one(EventTable).highlighted
        if event is None or event.status != DEAD_LETTER:
            return
        kind = f"{event.event_type} v{event.event_version}"
        self.app.push_screen(
            ConfirmModal(
                "Replay dead letter",
                replay_body(1, {kind: 1}, f"event {short_id(event.id)}"),
                confirm_label="Replay",
                ask_reason=True,
            ),
            lambda decision: self._replay_decided(decision, (event.id,)),
        )

    def action_replay_matching(self) -> None:
        view = self.view
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
        if action == "replay_one":
            event = self._highlighted()
            return True if event is not None and event.status == DEAD_LETTER else None
        if action == "close_detail":
            return self.detail_open
        if action == "older_page":
            return True if self.view.has_more else None
        if action == "newer_page":
            return True if self.view.page_number > 1 else None
        return True

    def _highlighted(self) -> EventSummary | None:
        try:
            return self.query_one(EventTable).highlighted
        except Exception:  # before compose
            return None
