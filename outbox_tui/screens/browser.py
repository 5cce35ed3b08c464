"""The event browser: views (events, dead letters, blocked keys), paging, filter, detail.

Part of ``MainScreen``; it loads pages through ``OutboxInsights`` in workers and
keeps, per view, its filter and keyset cursors (``ViewState``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from textual import on, work
from textual.coordinate import Coordinate
from textual.widgets import DataTable

from engine.errors import OutboxError
from engine.operating.insights import BlockedKey, EventFilter, EventPage, EventSummary
from engine.storage.schema import DEAD_LETTER
from outbox_tui.messages import BlockedPage, PageLoaded, PollFailed, ViewPage
from outbox_tui.screens.detail_host import DetailHost
from outbox_tui.screens.filter import FilterModal
from outbox_tui.widgets.blocked_keys import BlockedKeysTable
from outbox_tui.widgets.event_table import EventTable
from outbox_tui.widgets.format import one_line

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


class EventBrowser(DetailHost):
    """Views, paging, the filter and the detail pane of the main screen."""

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
        # The new page opens on its first row; moving the cursor now would only redraw
        # the old page once more (decision 0032).
        table.top_on_next_page = True
        self._view_changed()

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
        self.open_detail_from_list()

    @on(DataTable.RowHighlighted, "#events, #blocked-keys")
    def _row_highlighted(self) -> None:
        self.sync_footer()
        self.follow_cursor()

    def sync_footer(self) -> None:
        """Refresh the bindings only when a key the footer shows changes.

        Refreshing them rebuilds the footer: on every arrow key and every page it was
        most of the work (decision 0032). What the footer shows for the list depends on
        these alone (``MainScreen.check_action``).
        """
        target = self._target()
        shown = (
            self.mode,
            self.view.has_more,
            self.view.page_number > 1,
            self.detail_open,
            None
            if target is None
            else (target.status == DEAD_LETTER, target.ordering_key is not None),
        )
        if shown != self._footer_shown:
            self._footer_shown = shown
            self.refresh_bindings()

    def detail_list(self) -> DataTable[Any]:
        return self._list_table()

    def detail_target_id(self) -> str | None:
        target = self._target()
        return None if target is None else target.id

    def no_detail_message(self) -> str:
        return "No key." if self.mode == BLOCKED else "No event highlighted."
