"""The main screen: lays out the panels, polls, and hands each verb to the part that does it.

Its parts are components, each constructed with what it uses: the event browser
(``browser``, the list box), replay and skip (``dead_letter_actions``), pause and
resume (``incident_actions``), the dispatch switch (``dispatch_switch``) and the
published recount (``published_recount``). The screen binds the keys of the action
table (``outbox_tui.actions``), decides which are offered (``check_action``) and
passes each part what it acts on: the highlighted ``Target``, the current view.

Data flow: a timer starts an exclusive ``poll`` worker; the worker asks
``OutboxInsights`` (the live overview, the top types, the page) and ``engine.service``
(the active pauses) and posts ``PollSucceeded`` / ``PollFailed``; the handlers
update the widgets, and add the snapshot to the ``Trends`` ring the overview draws.
The next poll is scheduled only after the previous one finished, so polls never
overlap, and polling pauses while a dialog is open.
"""

from __future__ import annotations

import asyncio
from collections import deque
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.timer import Timer
from textual.widgets import DataTable, Static
from textual.worker import Worker, WorkerState

from engine.errors import OutboxError
from engine.operating.insights import EventFilter, OverviewSnapshot
from engine.operating.trends import Sample, Trends
from engine.service import paused_backlog
from engine.storage.schema import DEAD_LETTER
from outbox_tui.actions import bindings
from outbox_tui.messages import ActionFailed, PollFailed, PollSucceeded, WorkerFailed
from outbox_tui.screens.browser import BLOCKED, DEAD_LETTERS, EVENTS, EventBrowser, ViewState
from outbox_tui.screens.dead_letter_actions import DeadLetterActions
from outbox_tui.screens.detail_host import DetailHost
from outbox_tui.screens.dispatch_switch import DispatchSwitch
from outbox_tui.screens.incident_actions import IncidentActions
from outbox_tui.screens.palette import ConsoleCommands
from outbox_tui.screens.published_recount import PublishedRecount
from outbox_tui.widgets.consumers import ConsumersPanel
from outbox_tui.widgets.dispatchers import DispatchersPanel
from outbox_tui.widgets.event_detail import EventDetailPane
from outbox_tui.widgets.footer import ConsoleFooter
from outbox_tui.widgets.format import one_line, timestamp
from outbox_tui.widgets.note_line import NoteLine
from outbox_tui.widgets.overview import OverviewPanel
from outbox_tui.widgets.status_bar import StatusBar
from outbox_tui.widgets.trend import TrendView

if TYPE_CHECKING:
    from outbox_tui.app import OutboxConsole

THROUGHPUT_POINTS = 60
TREND_SAMPLES = 120  # two minutes at the default refresh of one second
TOP_TYPES = 5


class MainScreen(DetailHost):
    """Everything on one screen; the bindings here are the console's verbs."""

    COMMANDS = {ConsoleCommands}  # noqa: RUF012 - Textual's declaration style
    BINDINGS = bindings(app=False)

    dispatch_state: reactive[str] = reactive("stopped", bindings=True)
    connection: reactive[str] = reactive("connecting")

    def __init__(self, console: OutboxConsole) -> None:
        super().__init__(console, id="main")
        self.browser = EventBrowser(
            console, detail_open=lambda: self.detail_open, shown=self.sync_footer, id="list"
        )
        self.dead_letters = DeadLetterActions(console, changed=self.poll_now)
        self.incidents = IncidentActions(console, changed=self.poll_now)
        self.switch = DispatchSwitch(console, set_state=self._set_dispatch, changed=self.poll_now)
        self.recount = PublishedRecount(console)
        self.refreshes = 0  # successful polls applied (tests wait on this)
        self.failures = 0  # consecutive failed polls
        self.last_snapshot: OverviewSnapshot | None = None
        self.throughput: deque[int] = deque(maxlen=THROUGHPUT_POINTS)
        self.trends = Trends(TREND_SAMPLES)
        self.trend: TrendView | None = None  # the last one drawn (tests read its verdict)
        self._footer_shown: tuple[object, ...] | None = None
        self._poll_timer: Timer | None = None
        self._poll_waiting = False
        self._deferred: PollSucceeded | None = None
        self._last_good: datetime | None = None

    @property
    def mode(self) -> str:
        """The view the list shows: events, dead letters or blocked keys."""
        return self.browser.mode

    @property
    def view(self) -> ViewState:
        return self.browser.view

    # -- layout -------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        config = self.console.config
        yield StatusBar(self.console.display_url, config.refresh_seconds, id="status-bar")
        yield NoteLine(config.note, id="note")
        yield Static("", id="banner")
        yield OverviewPanel(config.pending_age, id="overview")
        yield DispatchersPanel(id="dispatchers")
        yield ConsumersPanel(id="consumers")
        with Horizontal(id="body"):
            yield self.browser
            yield EventDetailPane(id="detail", trace_url_template=config.trace_url_template)
        yield ConsoleFooter()
        yield from (self.dead_letters, self.incidents, self.switch, self.recount)

    def on_mount(self) -> None:
        self.console.dispatch.on_exit = self.switch.exited
        self.browser.list_table().focus()
        self.poll_now()
        if self.console.config.autostart_dispatch:
            self.action_start_dispatch()

    # -- polling ------------------------------------------------------------------------

    def poll_now(self) -> None:
        """Refresh at once (cancelling a poll in flight); the timer restarts after it."""
        if self._poll_timer is not None:
            self._poll_timer.stop()
            self._poll_timer = None
        self._poll_waiting = False
        self._poll(self.browser.generation)

    def _schedule_poll(self) -> None:
        if self._poll_timer is not None:
            self._poll_timer.stop()
        self._poll_timer = self.set_timer(self.console.config.refresh_seconds, self._poll_due)

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
        insights, db = self.console.insights, self.console.db
        timeout = self.console.config.poll_timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                snapshot = await self.recount.live_overview()
                pauses = await db(paused_backlog(self.console.engine))
                top = await db(insights.top_types(limit=TOP_TYPES))
                page = await self.browser.fetch(view)
        except TimeoutError:
            self.post_message(PollFailed(f"the database did not answer within {timeout:g}s"))
        except OutboxError as exc:
            self.post_message(PollFailed(one_line(exc)))
        else:
            self.post_message(
                PollSucceeded(snapshot, page, generation, pauses=pauses, top_types=top)
            )
            self.recount.recount_when_due(snapshot.taken_at)
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
        self.query_one(ConsumersPanel).show(snap.heartbeats, self.console.inbound_window)
        self.browser.polled(snap, message.page, message.generation)
        self.refreshes += 1
        if self.refreshes == 1:
            self.call_after_refresh(self.console.settle_collector)  # once it is drawn
        if self.detail_open:
            self.load_detail()

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
                    f"  Retrying every {self.console.config.refresh_seconds:g}s "
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
        for selector in ("#overview", "#dispatchers", "#consumers", "#list"):
            self.query_one(selector).set_class(connection == "lost", "-stale")

    def _set_dispatch(self, state: str) -> None:
        self.dispatch_state = state

    def watch_dispatch_state(self, state: str) -> None:
        bar = self.query_one(StatusBar)
        bar.dispatch = state
        bar.dispatch_target = self.console.dispatch.target
        self.query_one(DispatchersPanel).local_dispatch_changed(state)

    # -- errors -------------------------------------------------------------------------

    @on(ActionFailed)
    def _action_failed(self, message: ActionFailed) -> None:
        self.say(message.error, title=f"{message.what} failed", severity="error", timeout=8)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:  # the screen's own workers (poll, detail)
            self._worker_failed(WorkerFailed(event.worker.group, event.worker.error))

    @on(WorkerFailed)
    def _worker_failed(self, message: WorkerFailed) -> None:
        """The one place an unexpected worker failure is turned into something visible."""
        error = message.error
        self.say(
            f"{type(error).__name__}: {error}",
            title=f"Unexpected error in {message.group}",
            severity="error",
            timeout=10,
        )
        if message.group == "poll":
            self._schedule_poll()
        elif message.group == "dispatch":
            self.dispatch_state = "running" if self.console.dispatch.running else "stopped"

    # -- the verbs: which are offered, and the part that does each -------------------------

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
        target = self.browser.target() if action in _ON_TARGET else None
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

    def action_show_events(self) -> None:
        self.browser.switch(EVENTS)

    def action_show_dead_letters(self) -> None:
        self.browser.switch(DEAD_LETTERS)

    def action_show_blocked_keys(self) -> None:
        self.browser.switch(BLOCKED)

    def action_show_key_events(self) -> None:
        self.browser.show_key_events()

    def action_show_error_groups(self) -> None:
        from outbox_tui.screens.error_groups import ErrorGroupsScreen

        self.app.push_screen(ErrorGroupsScreen(self.console))

    def action_show_catalog(self) -> None:
        from outbox_tui.screens.catalog import CatalogScreen

        self.app.push_screen(CatalogScreen(self.console))

    def action_older_page(self) -> None:
        self.browser.older_page()

    def action_newer_page(self) -> None:
        self.browser.newer_page()

    def action_first_page(self) -> None:
        self.browser.first_page()

    def action_filter(self) -> None:
        self.browser.choose_filter()

    def action_clear_filter(self) -> None:
        self.browser.set_filter(EventFilter())

    def action_refresh_now(self) -> None:
        self.poll_now()

    def action_replay_one(self) -> None:
        self.dead_letters.replay_one(self.browser.target())

    def action_replay_matching(self) -> None:
        self.dead_letters.replay_matching(self.view)

    def action_skip_dead_letter(self) -> None:
        self.dead_letters.skip_dead_letter(self.browser.target())

    def action_pause_type(self) -> None:
        self.incidents.pause_or_resume(self.browser.target())

    def action_start_dispatch(self) -> None:
        self.switch.start()

    def action_stop_dispatch(self) -> None:
        self.switch.stop()

    # -- the detail beside the list ---------------------------------------------------------

    @on(DataTable.RowSelected, "#events, #blocked-keys")
    def _row_selected(self) -> None:
        self.open_detail_from_list()

    @on(DataTable.RowHighlighted, "#events, #blocked-keys")
    def _row_highlighted(self) -> None:
        self.sync_footer()
        self.follow_cursor()

    def sync_footer(self) -> None:
        """Refresh the bindings only when a key the footer shows changes.

        Refreshing them rebuilds the footer: on every arrow key and every page it was most
        of the work (decision 0032). What the footer shows for the list depends on these
        alone (``check_action``).
        """
        shown = (*self.browser.footer_state(), self.detail_open)
        if shown != self._footer_shown:
            self._footer_shown = shown
            self.refresh_bindings()

    def detail_list(self) -> DataTable[Any]:
        return self.browser.list_table()

    def detail_target_id(self) -> str | None:
        target = self.browser.target()
        return None if target is None else target.id

    def no_detail_message(self) -> str:
        return self.browser.no_target_message()


_ON_TARGET = ("replay_one", "skip_dead_letter", "show_key_events", "pause_type")
# The blocked-keys view has no filter and no pages (it lists the oldest heads).
_NOT_FOR_KEYS = ("filter", "replay_matching", "older_page", "newer_page")
