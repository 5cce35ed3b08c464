"""What an operator browses: the event filter, table rows, pages, details and match counts.

``engine.operating.insights.OutboxInsights`` answers with these (and re-exports them);
``filtered`` narrows a statement on ``outbox_events`` by an ``EventFilter``, for the
insights' pages and counts alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, literal, or_, select, text

from engine.errors import ConfigurationError
from engine.operating.dispatch_health import KEY_UNFINISHED
from engine.storage.schema import (
    AT_REST_PREDICATE,
    LEASED_PREDICATE,
    PUBLISHING,
    STATUSES,
    outbox_events,
)
from engine.tracing.propagation import TraceParent, parse_traceparent

t = outbox_events


@dataclass(frozen=True, slots=True)
class EventFilter:
    """What an operator narrowed the event list to; empty fields match everything."""

    statuses: tuple[str, ...] = ()
    event_type: str | None = None
    tenant_id: str | None = None
    aggregate_id: str | None = None
    # Only the key's events that are not delivered yet (the ones that wait in order).
    ordering_key: str | None = None
    # "inbound": events the inbox received (engine.inbox); "local": the others.
    origin: str | None = None

    def describe(self) -> str:
        parts = []
        if self.statuses:
            parts.append("status=" + ",".join(self.statuses))
        if self.origin:
            parts.append(f"origin={self.origin}")
        if self.ordering_key:
            parts.append(f"key={self.ordering_key} (undelivered)")
        for name in ("event_type", "tenant_id", "aggregate_id"):
            value = getattr(self, name)
            if value:
                parts.append(
                    f"{name.removesuffix('_id') if name != 'event_type' else 'type'}={value}"
                )
        return " ".join(parts) or "all events"


@dataclass(frozen=True, slots=True)
class EventSummary:
    """One row of the event table (no payload)."""

    id: str
    status: str
    event_type: str
    event_version: int
    tenant_id: str
    aggregate_type: str
    aggregate_id: str
    attempt_count: int
    max_attempts: int
    next_retry_at: datetime | None
    created_at: datetime
    last_error: str | None
    dead_letter_reason: str | None
    replay_count: int
    ordering_key: str | None = None


@dataclass(frozen=True, slots=True)
class EventPage:
    events: Sequence[EventSummary]
    has_more: bool

    @property
    def next_cursor(self) -> str | None:
        """Pass as ``before`` to get the next (older) page."""
        return self.events[-1].id if self.has_more and self.events else None


@dataclass(frozen=True, slots=True)
class EventDetail:
    """Everything known about one event."""

    columns: Mapping[str, Any]
    payload: Any
    payload_error: str | None
    replays: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    handler_runs: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    side_effects: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    # Undelivered events of the same ordering key written before this one (None: unordered).
    earlier_in_key: int | None = None
    # The events of its chain in write order (its first event and every event caused by
    # it, directly or not), at most CHAIN_LIMIT; one event alone is a chain of one.
    chain: Sequence[Mapping[str, Any]] = field(default_factory=tuple)

    @property
    def chain_id(self) -> str:
        """The first event of this event's chain."""
        return str(self.columns.get("correlation_id") or self.columns["id"])

    @property
    def trace_parent(self) -> TraceParent | None:
        """The stored W3C context (``traceparent``): the event's trace and the span its
        own spans hang under (its outbox write's, or an inbound event's sender's)."""
        value = self.columns.get("traceparent")
        return parse_traceparent(value) if isinstance(value, str) else None

    @property
    def trace_id(self) -> str | None:
        """The stored context's trace id, else the payload's ``trace_id`` (as before)."""
        parent = self.trace_parent
        if parent is not None:
            return parent.trace_id
        if isinstance(self.payload, Mapping) and self.payload.get("trace_id") is not None:
            return str(self.payload["trace_id"])
        return None


@dataclass(frozen=True, slots=True)
class MatchSummary:
    """How many events a filter matches, by type (for replay confirmations).

    ``ids`` is filled by ``match_events``: the exact rows counted, so an action
    confirmed on this summary touches those rows and no row that arrived later.
    """

    total: int
    by_type: Mapping[str, int]
    ids: tuple[str, ...] = ()


SUMMARY_COLUMNS = (
    t.c.id,
    t.c.status,
    t.c.event_type,
    t.c.event_version,
    t.c.tenant_id,
    t.c.aggregate_type,
    t.c.aggregate_id,
    t.c.attempt_count,
    t.c.max_attempts,
    t.c.next_retry_at,
    t.c.created_at,
    t.c.last_error,
    t.c.dead_letter_reason,
    t.c.replay_count,
    t.c.ordering_key,
)


def status_clause(status: str) -> ColumnElement[bool]:
    """Rows of one status, spelled so that PostgreSQL reads them through an index.

    Rows in flight are the leased ones (a claim sets the lease, every completion or
    release clears it: engine.storage.schema), so "publishing" adds the lease index's predicate;
    the status index holds the other statuses but ``published`` (engine.storage.schema). The
    status is written into the statement (one of ``STATUSES``, checked): PostgreSQL uses
    a partial index only for a value it sees, never in a generic plan of a parameter.
    """
    if status not in STATUSES:
        raise ConfigurationError(f"unknown status {status!r}: use one of {', '.join(STATUSES)}")
    matches = t.c.status == literal(status, literal_execute=True)
    return and_(matches, text(LEASED_PREDICATE)) if status == PUBLISHING else matches


def aggregate_clause(aggregate_id: str) -> ColumnElement[bool]:
    """Rows of one aggregate: those at rest through the aggregate index, those in flight
    through the lease index (on PostgreSQL the aggregate index leaves them out)."""
    return and_(
        t.c.aggregate_id == aggregate_id,
        or_(text(AT_REST_PREDICATE), text(LEASED_PREDICATE)),
    )


def filtered(stmt: Select[Any], flt: EventFilter) -> Select[Any]:
    if flt.statuses:
        clauses = [status_clause(status) for status in flt.statuses]
        stmt = stmt.where(clauses[0] if len(clauses) == 1 else or_(*clauses))
    if flt.event_type:
        stmt = stmt.where(t.c.event_type == flt.event_type)
    if flt.tenant_id:
        stmt = stmt.where(t.c.tenant_id == flt.tenant_id)
    if flt.aggregate_id:
        stmt = stmt.where(aggregate_clause(flt.aggregate_id))
    if flt.ordering_key:
        stmt = stmt.where(t.c.ordering_key == flt.ordering_key, KEY_UNFINISHED)
    if flt.origin:
        stmt = stmt.where(origin_clause(flt.origin))
    return stmt


ORIGINS = ("inbound", "local")


def origin_clause(origin: str) -> ColumnElement[bool]:
    """Events the inbox received (every inbound row names its queue, dead letters too), or
    the others. No index: the event list reads pages newest first and stops at a page."""
    if origin not in ORIGINS:
        raise ConfigurationError(f"unknown origin {origin!r}: use {' or '.join(ORIGINS)}")
    return t.c.inbound_queue.is_not(None) if origin == "inbound" else t.c.inbound_queue.is_(None)


# Events of one chain an event detail lists at most.
CHAIN_LIMIT = 50


def chain_statement(chain_id: str) -> Select[Any]:
    """A chain's events in write order: its first event and the ones correlated to it."""
    return (
        select(t.c.id, t.c.event_type, t.c.status, t.c.causation_id, t.c.created_at)
        .where(or_(t.c.id == chain_id, t.c.correlation_id == chain_id))
        .order_by(t.c.seq)
        .limit(CHAIN_LIMIT)
    )
