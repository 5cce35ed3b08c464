"""The event browser: the list box of the main screen, with its views (events, dead
letters, blocked keys), keyset paging and filter.

It keeps, per view, its filter and keyset cursors (``ViewState``) and loads a page in a
worker when the view changes; ``MainScreen``'s refresh brings the page of the current
view too (``fetch``, ``polled``). It tells its screen through ``detail_open`` whether
the detail is open (the list then keeps its cursor on the event being read) and calls
``shown`` after every page it shows (the screen's footer follows the list).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.coordinate import Coordinate
from textual.reactive import reactive
from textual.widgets import Static
from textual.worker import Worker, WorkerState

from engine.errors import OutboxError
from engine.operating.insights import (
    BlockedKey,
    EventFilter,
    EventPage,
    EventSummary,
    OverviewSnapshot,
)
from engine.storage.schema import DEAD_LETTER
from outbox_tui.messages import BlockedPage, PageLoaded, PollFailed, ViewPage, WorkerFailed
from outbox_tui.screens.filter import FilterModal
from outbox_tui.widgets.blocked_keys import BlockedKeysTable
from outbox_tui.widgets.event_table import EventTable
from outbox_tui.widgets.format import one_line

if TYPE_CHECKING:
    from outbox_tui.app import OutboxConsole

EVENTS, DEAD_LETTERS, BLOCKED = "events", "dead_letters", "blocked_keys"


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


def list_titles(
    mode: str, view: ViewState, page: ViewPage | None, blocked_total: int | None
) -> tuple[str, str]:
    """The title and subtitle of the list's box (``page`` None: still loading)."""
    if mode == BLOCKED:
        title = f"Blocked keys · {view.describe()} · oldest head first"
        if not isinstance(page, BlockedPage):
            return title, ""
        total = len(page.keys) if blocked_total is None else blocked_total
        shown = f"{len(page.keys)} shown" + (f" of {total:,}" if total > len(page.keys) else "")
        hints = ["enter head detail", "w its events", "k skip", "r replay"]
        return title, " · ".join([shown, *hints])
    name = "Dead letters" if mode == DEAD_LETTERS else "Events"
    title = f"{name} · {view.describe()} · page {view.page_number}, newest first"
    if not isinstance(page, EventPage):
        return title, ""
    hints = []
    if view.page_number > 1:
        hints.append("[ newer")
    if page.has_more:
        hints.append("] older")
    return title, " · ".join([f"{len(page.events)} shown", *hints])


class EventBrowser(Vertical):
    """The list box: one view's page at a time, the view's title and what is highlighted."""

    mode: reactive[str] = reactive(EVENTS, bindings=True)

    def __init__(
        self,
        console: OutboxConsole,
        *,
        detail_open: Callable[[], bool],
        shown: Callable[[], None],
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        self.console = console
        self._detail_open = detail_open
        self._shown = shown
        self.views = {mode: ViewState(mode) for mode in (EVENTS, DEAD_LETTERS, BLOCKED)}
        self.generation = 0  # bumped by every change of view: older pages are dropped
        self.pages = 0  # pages loaded by navigation (filter, view, paging; tests wait on it)
        self._snapshot: OverviewSnapshot | None = None  # the last refresh's
        self._titles_shown: tuple[str, str] | None = None

    @property
    def view(self) -> ViewState:
        return self.views[self.mode]

    def compose(self) -> ComposeResult:
        yield EventTable(id="events")
        keys = BlockedKeysTable(id="blocked-keys")
        keys.display = False
        yield keys
        yield Static("", id="empty-list")

    def on_mount(self) -> None:
        self._update_titles(None)

    # -- pages ----------------------------------------------------------------------------

    async def fetch(self, view: ViewState) -> ViewPage:
        """The rows ``view`` shows now: a page of events, or the blocked keys."""
        console = self.console
        if view.mode == BLOCKED:
            keys = await console.db(console.insights.blocked_keys(limit=console.config.page_size))
            return BlockedPage(tuple(keys))
        return await console.db(
            console.insights.events_page(
                view.query_filter, limit=console.config.page_size, before=view.before
            )
        )

    def polled(self, snapshot: OverviewSnapshot, page: ViewPage, generation: int) -> None:
        """A refresh answered: show its page unless the view changed since it asked."""
        self._snapshot = snapshot
        if generation == self.generation:
            self._show_page(page, snapshot.taken_at)

    def _view_changed(self) -> None:
        """Filter, view or page changed: load just that page now (the counts can wait)."""
        self.generation += 1
        self._update_titles(None)
        self._load_page(self.generation)

    @work(exclusive=True, group="page", exit_on_error=False)
    async def _load_page(self, generation: int) -> None:
        try:
            page = await self.fetch(self.view)
        except OutboxError as exc:
            self.post_message(PollFailed(one_line(exc)))
        else:
            self.post_message(PageLoaded(page, generation))

    @on(PageLoaded)
    def _page_loaded(self, message: PageLoaded) -> None:
        if message.generation != self.generation:
            return  # the operator moved on; a newer load is on its way
        snap = self._snapshot
        self._show_page(message.page, snap.taken_at if snap else self.console.clock())
        self.pages += 1

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:  # the screen shows it
            self.post_message(WorkerFailed(event.worker.group, event.worker.error))

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
            table.show(self.mode, page.events, now, follow_head=not self._detail_open())
            empty.display = not page.events
            if not page.events:
                what = "dead letters" if self.mode == DEAD_LETTERS else "events"
                described = view.describe()
                hint = "" if described.startswith("all ") else " Press / to change the filter."
                empty.update(Content(f"No {what} match {described}.{hint}"))
        self._update_titles(page)
        self._shown()

    def _update_titles(self, page: ViewPage | None) -> None:
        blocked = self._snapshot.blocked_keys if self._snapshot else None
        titles = list_titles(self.mode, self.view, page, blocked)
        # Setting a border title repaints the whole box, the event table's rows included:
        # a refresh that changes neither title leaves them as they are.
        if titles != self._titles_shown:
            self._titles_shown = titles
            self.border_title, self.border_subtitle = (Content(t) for t in titles)

    # -- views, paging, filter ------------------------------------------------------------

    def switch(self, mode: str) -> None:
        """Show the view ``mode`` (events, dead letters or blocked keys)."""
        if self.mode != mode:
            self.mode = mode
            blocked = mode == BLOCKED
            self.query_one(EventTable).display = not blocked
            self.query_one(BlockedKeysTable).display = blocked
            self._view_changed()
        self.list_table().focus()

    def show_key_events(self) -> None:
        """The undelivered events of the highlighted key (or event's key), in the events view."""
        target = self.target()
        if target is None or target.ordering_key is None:
            return
        view = self.views[EVENTS]
        view.filter = EventFilter(ordering_key=target.ordering_key)
        view.cursors = [None]
        view.has_more = False
        if self.mode == EVENTS:
            self._view_changed()
        else:
            self.switch(EVENTS)

    def list_table(self) -> EventTable | BlockedKeysTable:
        """The table the current view shows."""
        if self.mode == BLOCKED:
            return self.query_one(BlockedKeysTable)
        return self.query_one(EventTable)

    def older_page(self) -> None:
        table = self.query_one(EventTable)
        if self.mode == BLOCKED or not self.view.has_more or table.row_count == 0:
            return
        last = table.coordinate_to_cell_key(Coordinate(table.row_count - 1, 0)).row_key.value
        self.view.cursors.append(last)
        self.view.has_more = False
        # The new page opens on its first row; moving the cursor now would only redraw
        # the old page once more (decision 0032).
        table.top_on_next_page = True
        self._view_changed()

    def newer_page(self) -> None:
        if self.view.page_number > 1:
            self.view.cursors.pop()
            self._view_changed()

    def first_page(self) -> None:
        if self.view.page_number > 1:
            self.view.cursors = [None]
            self._view_changed()
        self.list_table().move_cursor(row=0)

    def choose_filter(self) -> None:
        """Open the filter dialog on the current view's filter."""
        if self.mode == BLOCKED:
            return
        known_types = [t for t, _v in self.console.registry.event_types()]
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

    # -- what is highlighted ----------------------------------------------------------------

    def target(self) -> Target | None:
        """What ``r``, ``k``, ``w``, ``p`` and the detail act on in the current view."""
        try:
            if self.mode == BLOCKED:
                key = self.query_one(BlockedKeysTable).highlighted
                return Target.of_key(key) if key is not None else None
            event = self.query_one(EventTable).highlighted
        except Exception:  # before compose
            return None
        return Target.of_event(event) if event is not None else None

    def footer_state(self) -> tuple[object, ...]:
        """What the footer's keys for the list depend on (``MainScreen.check_action``)."""
        target = self.target()
        return (
            self.mode,
            self.view.has_more,
            self.view.page_number > 1,
            None
            if target is None
            else (target.status == DEAD_LETTER, target.ordering_key is not None),
        )

    def no_target_message(self) -> str:
        return "No key." if self.mode == BLOCKED else "No event highlighted."
