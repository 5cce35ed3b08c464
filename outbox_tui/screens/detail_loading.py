"""Loading an event's detail and showing it in the pane: one way for every list screen.

The event browser and a group's event list both open the detail beside their list; both
read it here (with the count of events waiting behind a head that holds its key back)
and show it, or why it could not be read, the same way.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from engine.errors import OutboxError
from engine.storage.schema import DEAD_LETTER, FAILED
from outbox_tui.messages import DetailLoaded
from outbox_tui.widgets.event_detail import EventDetailPane
from outbox_tui.widgets.format import one_line

if TYPE_CHECKING:
    from outbox_tui.app import OutboxConsole


async def load_event_detail(console: OutboxConsole, event_id: str) -> DetailLoaded:
    """The detail of ``event_id`` as a message (an error in it when it cannot be read)."""
    insights, db = console.insights, console.db
    try:
        detail = await db(insights.event_detail(event_id))
        waiting = None
        columns = detail.columns
        if columns.get("ordering_key") and columns.get("status") in (DEAD_LETTER, FAILED):
            waiting = await db(insights.waiting_behind(event_id))
    except OutboxError as exc:
        return DetailLoaded(event_id, None, one_line(exc))
    return DetailLoaded(event_id, detail, None, waiting)


def show_event_detail(pane: EventDetailPane, message: DetailLoaded, now: datetime) -> None:
    """Show a loaded detail, or its error, in ``pane``."""
    if message.detail is None:
        pane.event_id = message.event_id
        pane.show_message(message.error or "unknown error", error=True)
        return
    pane.show(message.detail, now, waiting=message.waiting)
