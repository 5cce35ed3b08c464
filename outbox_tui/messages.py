"""The typed messages workers post; widgets change only in the handlers of these.

Every database call of the console runs in a worker. A worker never touches a
widget: it posts one of these messages and the screen's ``@on`` handler
updates the widgets on the UI side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from textual.message import Message

from engine.operating.insights import (
    BlockedKey,
    EventDetail,
    EventFilter,
    EventPage,
    OverviewSnapshot,
    TypeCounts,
)
from engine.service.incidents import PausedBacklog


@dataclass(frozen=True, slots=True)
class BlockedPage:
    """What the blocked-keys view shows: the keys held back by their head, oldest first."""

    keys: Sequence[BlockedKey]


# One view's rows: a page of events, or the blocked keys.
ViewPage = EventPage | BlockedPage


class PollSucceeded(Message):
    """One refresh answered: the overview, the active pauses with what each holds back,
    the types with the most undelivered events, and the page the current view shows."""

    def __init__(
        self,
        snapshot: OverviewSnapshot,
        page: ViewPage,
        generation: int,
        *,
        pauses: Sequence[PausedBacklog] = (),
        top_types: Sequence[TypeCounts] = (),
    ) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.page = page
        self.generation = generation  # which view state asked (stale answers are dropped)
        self.pauses = pauses
        self.top_types = top_types


class PageLoaded(Message):
    """A page of events for a view that just changed (filter, view, paging)."""

    def __init__(self, page: ViewPage, generation: int) -> None:
        super().__init__()
        self.page = page
        self.generation = generation


class PollFailed(Message):
    """A refresh failed: the database is unreachable, the schema went away, a timeout."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class DetailLoaded(Message):
    """The detail of one event (or why it could not be read).

    ``waiting`` counts the events of its ordering key behind it when it can hold the key
    back (a failed or dead-lettered event with a key); None otherwise.
    """

    def __init__(
        self,
        event_id: str,
        detail: EventDetail | None,
        error: str | None,
        waiting: int | None = None,
    ) -> None:
        super().__init__()
        self.event_id = event_id
        self.detail = detail
        self.error = error
        self.waiting = waiting


class ReplayPrepared(Message):
    """How many dead letters a bulk replay would touch, by type, before anyone confirms."""

    def __init__(
        self, flt: EventFilter, total: int, by_type: Mapping[str, int], ids: tuple[str, ...]
    ) -> None:
        super().__init__()
        self.filter = flt
        self.total = total
        self.by_type = by_type
        self.ids = ids  # exactly the rows counted: confirming replays these and no others


class ReplayFinished(Message):
    """A confirmed replay ran: how many went back to pending, and what was refused."""

    def __init__(self, replayed: int, refused: Mapping[str, str], error: str | None = None) -> None:
        super().__init__()
        self.replayed = replayed
        self.refused = refused
        self.error = error


class SkipPrepared(Message):
    """A dead letter the operator may skip, and what skipping it would release."""

    def __init__(self, event_id: str, kind: str, ordering_key: str, waiting: int) -> None:
        super().__init__()
        self.event_id = event_id
        self.kind = kind  # "orders.placed v1"
        self.ordering_key = ordering_key
        self.waiting = waiting  # events of the key behind it when the dialog opened


class SkipFinished(Message):
    """A confirmed skip ran: whether the key was released, or why not."""

    def __init__(
        self,
        event_id: str,
        ordering_key: str,
        waiting: int,
        *,
        refused: str | None = None,
        error: str | None = None,
    ) -> None:
        super().__init__()
        self.event_id = event_id
        self.ordering_key = ordering_key
        self.waiting = waiting
        self.refused = refused
        self.error = error


class DispatchChanged(Message):
    """The in-process dispatcher started, stopped, or failed to do either."""

    def __init__(self, running: bool, *, note: str = "", error: str | None = None) -> None:
        super().__init__()
        self.running = running
        self.note = note
        self.error = error


class ActionFailed(Message):
    """A user action's worker failed with an engine error (shown as a toast)."""

    def __init__(self, what: str, error: str) -> None:
        super().__init__()
        self.what = what
        self.error = error


class WorkerFailed(Message):
    """A screen part's worker ended with an unexpected error (a bug, not an engine error).

    Posted by the part, it bubbles to the screen, which shows it (Textual's own
    ``Worker.StateChanged`` does not leave the node that ran the worker).
    """

    def __init__(self, group: str, error: BaseException | None) -> None:
        super().__init__()
        self.group = group
        self.error = error
