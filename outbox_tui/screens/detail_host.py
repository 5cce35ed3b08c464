"""A list screen with an event's detail beside it: open, follow the cursor, close.

The event browser and a group's event list behave alike here: ``enter`` opens the pane
(or focuses it when open), the pane follows the highlighted row, a detail that arrives
after the cursor moved on is dropped, and closing gives the focus back to the list. A
screen says which list it shows (``detail_list``), which event is highlighted
(``detail_target_id``) and what to say when none is; it routes its own list's
``RowSelected``/``RowHighlighted`` to ``open_detail_from_list``/``follow_cursor``.
"""

from __future__ import annotations

from typing import Any

from textual import on, work
from textual.reactive import reactive
from textual.widgets import DataTable

from outbox_tui.messages import DetailLoaded
from outbox_tui.screens.base import ConsoleScreen
from outbox_tui.screens.detail_loading import load_event_detail, show_event_detail
from outbox_tui.widgets.event_detail import EventDetailPane


class DetailHost(ConsoleScreen):
    """The detail pane's mechanics for a screen that lists events."""

    detail_open: reactive[bool] = reactive(False, bindings=True)

    # -- what a screen tells ------------------------------------------------------------

    def detail_list(self) -> DataTable[Any]:
        """The list the pane belongs to (it gets the focus back on close)."""
        raise NotImplementedError

    def detail_target_id(self) -> str | None:
        """The id of the event whose detail the pane shows, or None."""
        raise NotImplementedError

    def no_detail_message(self) -> str:
        return "No event highlighted."

    # -- the mechanics ------------------------------------------------------------------

    def open_detail_from_list(self) -> None:
        self.action_open_detail()

    def action_open_detail(self) -> None:
        if self.detail_open:
            self.query_one(EventDetailPane).focus()
            return
        self.detail_open = True

    def action_close_detail(self) -> None:
        self.detail_open = False

    def watch_detail_open(self, is_open: bool) -> None:
        self.query_one("#body").set_class(is_open, "-detail-open")
        if is_open:
            self.load_detail()
        else:
            self.detail_list().focus()

    def follow_cursor(self) -> None:
        """The highlighted row changed: load its detail when the pane shows another."""
        target = self.detail_target_id()
        pane = self.query_one(EventDetailPane)
        if self.detail_open and target is not None and target != pane.event_id:
            self.load_detail()

    def load_detail(self) -> None:
        target = self.detail_target_id()
        if target is None:
            pane = self.query_one(EventDetailPane)
            pane.event_id = None
            pane.show_message(self.no_detail_message())
            return
        self._load_detail(target)

    @work(exclusive=True, group="detail", exit_on_error=False)
    async def _load_detail(self, event_id: str) -> None:
        self.post_message(await load_event_detail(self.console, event_id))

    @on(DetailLoaded)
    def _detail_loaded(self, message: DetailLoaded) -> None:
        if self.detail_target_id() != message.event_id:
            return  # the cursor moved on; its own load is on the way
        show_event_detail(self.query_one(EventDetailPane), message, self.console.clock())
