"""The main screen: lays out the panels and polls; its parts do the rest.

The event browser (``browser``), replay and skip (``dead_letter_actions``) and the
dispatch switch (``dispatch_switch``) are the parts it combines; its key bindings
come from the action table (``outbox_tui.actions``).

Data flow: a timer starts an exclusive ``poll`` worker; the worker asks
``OutboxInsights`` (the live overview, the top types, the page) and ``engine.service``
(the active pauses) and posts ``PollSucceeded`` / ``PollFailed``; the handlers
update the widgets, and add the snapshot to the ``Trends`` ring the overview draws.
The next poll is scheduled only after the previous one finished, so polls never
overlap, and polling pauses while a dialog is open.

The published total and the purge backlog grow with the table, so a refresh does not
recount them (``published_recount``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from datetime import datetime
from typing import TYPE_CHECKING

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.reactive import reactive
from textual.timer import Timer
from textual.widgets import Static
from textual.worker import Worker, WorkerState

from engine.errors import OutboxError
from engine.operating.insights import OverviewSnapshot
from engine.operating.trends import Sample, Trends
from engine.service import paused_backlog
from engine.storage.schema import DEAD_LETTER
from outbox_tui.actions import bindings
from outbox_tui.messages import (
    ActionFailed,
    BlockedPage,
    PollFailed,
    PollSucceeded,
    ViewPage,
)
from outbox_tui.screens.palette import ConsoleCommands
from outbox_tui.widgets.blocked_keys import BlockedKeysTable
from outbox_tui.widgets.dispatchers import DispatchersPanel
from outbox_tui.widgets.event_detail import EventDetailPane
from outbox_tui.widgets.event_table import EventTable
from outbox_tui.widgets.format import one_line, timestamp
from outbox_tui.widgets.note_line import NoteLine
from outbox_tui.widgets.overview import OverviewPanel
from outbox_tui.widgets.status_bar import StatusBar
from outbox_tui.widgets.trend import TrendView

if TYPE_CHECKING:
    pass

from outbox_tui.screens.browser import (
    BLOCKED,
    DEAD_LETTERS,
    EVENTS,
    EventBrowser,
    Target,
    ViewState,
    list_titles,
)
from outbox_tui.screens.dead_letter_actions import DeadLetterActions
from outbox_tui.screens.dispatch_switch import DispatchSwitch
from outbox_tui.screens.incident_actions import IncidentActions
from outbox_tui.screens.published_recount import PublishedRecount
from outbox_tui.widgets.footer import ConsoleFooter

THROUGHPUT_POINTS = 60
TREND_SAMPLES = 120  # two minutes at the default refresh of one second
TOP_TYPES = 5


class MainScreen(
    EventBrowser, DeadLetterActions, DispatchSwitch, IncidentActions, PublishedRecount
):
    """Everything on one screen; the bindings here are the console's verbs."""

    COMMANDS = {ConsoleCommands}  # noqa: RUF012 - Textual's declaration style
    BINDINGS = bindings(app=False)

    mode: reactive[str] = reactive(EVENTS, bindings=True)
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
        self.trends = Trends(TREND_SAMPLES)
        self.trend: TrendView | None = None  # the last one drawn (tests read its verdict)
        self._footer_shown: tuple[object, ...] | None = None
        self._titles_shown: tuple[str, str] | None = None
        self._generation = 0
        self._poll_timer: Timer | None = None
        self._poll_waiting = False
        self._deferred: PollSucceeded | None = None
        self._last_good: datetime | None = None

    @property
    def view(self) -> ViewState:
        return self.views[self.mode]

    # -- layout -------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        config = self.console_app.config
        yield StatusBar(self.console_app.display_url, config.refresh_seconds, id="status-bar")
        yield NoteLine(config.note, id="note")
        yield Static("", id="banner")
        yield OverviewPanel(config.pending_age, id="overview")
        yield DispatchersPanel(id="dispatchers")
        with Horizontal(id="body"):
            with Vertical(id="list"):
                yield EventTable(id="events")
                yield BlockedKeysTable(id="blocked-keys")
                yield Static("", id="empty-list")
            yield EventDetailPane(id="detail")
        yield ConsoleFooter()

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
                snapshot = await self.live_overview()
                pauses = await db(paused_backlog(self.console_app.engine))
                top = await db(insights.top_types(limit=TOP_TYPES))
                page = await self._fetch(view)
        except TimeoutError:
            self.post_message(PollFailed(f"the database did not answer within {timeout:g}s"))
        except OutboxError as exc:
            self.post_message(PollFailed(one_line(exc)))
        else:
            self.post_message(
                PollSucceeded(snapshot, page, generation, pauses=pauses, top_types=top)
            )
            self.recount_when_due(snapshot.taken_at)
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
        if snap.published_since is not None:
            self.throughput.append(snap.published_since)
        self.last_snapshot = snap
        self.trends.add(Sample.from_overview(snap))
        whole = {p.pause.event_type for p in message.pauses if p.pause.tenant_id is None}
        held = sum(  # a tenant's pause inside a whole type's pause holds nothing more
            p.waiting
            for p in message.pauses
            if p.pause.tenant_id is None or p.pause.event_type not in whole
        )
        self.trend = TrendView.of(self.trends, held_by_pauses=held)
        self.query_one(OverviewPanel).show(
            snap,
            list(self.throughput),
            trend=self.trend,
            pauses=message.pauses,
            top_types=message.top_types,
        )
        self.query_one(DispatchersPanel).show(snap.heartbeats, snap.unserved)
        if message.generation == self._generation:
            self._show_page(message.page, snap.taken_at)
        self.refreshes += 1
        if self.refreshes == 1:
            self.call_after_refresh(self.console_app.settle_collector)  # once it is drawn
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
        self.sync_footer()

    def _update_titles(self, page: ViewPage | None) -> None:
        blocked = self.last_snapshot.blocked_keys if self.last_snapshot else None
        titles = list_titles(self.mode, self.view, page, blocked)
        # Setting a border title repaints the whole box, the event table's rows included:
        # a refresh that changes neither title leaves them as they are.
        if titles != self._titles_shown:
            self._titles_shown = titles
            box = self.query_one("#list", Vertical)
            box.border_title, box.border_subtitle = (Content(t) for t in titles)

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

    # -- errors and bindings ------------------------------------------------------------

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
        if action == "pause_type":
            return True if target is not None else None
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


_ON_TARGET = ("replay_one", "skip_dead_letter", "show_key_events", "pause_type")
# The blocked-keys view has no filter and no pages (it lists the oldest heads).
_NOT_FOR_KEYS = ("filter", "replay_matching", "older_page", "newer_page")
