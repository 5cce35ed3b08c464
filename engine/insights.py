"""The read side every front end uses: overview, event pages, details, heartbeats.

The CLI and the console never write SQL; they ask this service. Every query is
served by an index (counts by status, keyset pages by id), so the console stays
responsive with millions of rows, and all reads use deferred transactions so
they never take SQLite's write lock.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Integer, Select, Text, column, func, literal, select, text, type_coerce
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.selectable import TextualSelect

from engine.clock import Clock, utc_now
from engine.database import read_only_engine, storage_errors
from engine.errors import EventNotFoundError
from engine.schema import (
    BACKLOG_PREDICATE,
    DEAD_LETTER,
    FAILED,
    IN_FLIGHT_PREDICATE,
    KEY_STALLED_PREDICATE,
    KEY_UNFINISHED_PREDICATE,
    KEYED_PREDICATE,
    PENDING,
    PUBLISHED,
    PUBLISHING,
    REPLAYED_PENDING_PREDICATE,
    STATUSES,
    UtcDateTime,
    handler_runs,
    outbox_events,
    process_heartbeats,
    replay_log,
    side_effects,
)

t = outbox_events
ALIVE, STALE, STOPPED = "alive", "stale", "stopped"


@dataclass(frozen=True, slots=True)
class HeartbeatView:
    """One dispatcher process as an operator sees it."""

    instance_id: str
    kind: str
    host: str
    pid: int
    state: str  # alive | stale | stopped
    started_at: datetime
    last_seen_at: datetime
    last_seen_age_seconds: float
    details: Mapping[str, Any]

    @property
    def iterations(self) -> int:
        return int(self.details.get("iterations", 0) or 0)

    @property
    def waiting_for(self) -> str | None:
        """What this dispatcher's relay waits for (a broker outage), or None."""
        value = self.details.get("waiting_for")
        return str(value) if value else None

    @property
    def serves(self) -> list[str] | None:
        """The event types this dispatcher claims (None: a version that did not say)."""
        value = self.details.get("serves")
        return [str(v) for v in value] if isinstance(value, list) else None

    def total(self, name: str) -> int:
        totals = self.details.get("totals")
        source = totals if isinstance(totals, Mapping) else self.details
        return int(source.get(name, 0) or 0)


@dataclass(frozen=True, slots=True)
class OverviewSnapshot:
    """Counts and ages at one instant, for dashboards and `stats`."""

    taken_at: datetime
    counts: Mapping[str, int]
    published_recent: int
    recent_window_seconds: float
    # When the longest-waiting pending event became due: created, or replayed since.
    oldest_pending_at: datetime | None
    stuck_publishing: int
    awaiting_purge: int | None
    retention_seconds: float | None
    heartbeats: Sequence[HeartbeatView]
    # Ordering keys whose head is failed or dead-lettered, and the oldest such head.
    blocked_keys: int = 0
    oldest_blocked_head_at: datetime | None = None
    # Waiting events of types no live dispatcher serves (empty while none is alive).
    unserved: Sequence[UnservedType] = ()

    @property
    def oldest_pending_age_seconds(self) -> float | None:
        if self.oldest_pending_at is None:
            return None
        return max(0.0, (self.taken_at - self.oldest_pending_at).total_seconds())

    @property
    def oldest_blocked_head_age_seconds(self) -> float | None:
        if self.oldest_blocked_head_at is None:
            return None
        return max(0.0, (self.taken_at - self.oldest_blocked_head_at).total_seconds())


@dataclass(frozen=True, slots=True)
class UnservedType:
    """Waiting events of a type that no live dispatcher serves: they stay pending.

    During a rolling deploy these are the new version's new types until a new
    dispatcher runs; with services sharing a database, a type whose service is down.
    """

    event_type: str
    count: int
    oldest_created_at: datetime
    oldest_age_seconds: float


@dataclass(frozen=True, slots=True)
class TypeCounts:
    """One event type's undelivered events by status (``TYPE_STATUSES``)."""

    event_type: str
    counts: Mapping[str, int]

    @property
    def undelivered(self) -> int:
        return sum(self.counts.values())


#: The statuses ``top_types`` counts: waiting, in flight, failing and dead.
TYPE_STATUSES = (PENDING, PUBLISHING, FAILED, DEAD_LETTER)


@dataclass(frozen=True, slots=True)
class BlockedKey:
    """An ordering key held back by its head: a failed or dead-lettered event.

    ``waiting`` counts the unfinished events of the key behind the head; they
    go on once the head is published (a retry or a replay) or skipped.
    """

    ordering_key: str
    head_id: str
    head_status: str
    head_event_type: str
    head_error: str | None
    head_created_at: datetime
    head_age_seconds: float
    waiting: int


@dataclass(frozen=True, slots=True)
class EventFilter:
    """What an operator narrowed the event list to; empty fields match everything."""

    statuses: tuple[str, ...] = ()
    event_type: str | None = None
    tenant_id: str | None = None
    aggregate_id: str | None = None
    # Only the key's events that are not delivered yet (the ones that wait in order).
    ordering_key: str | None = None

    def describe(self) -> str:
        parts = []
        if self.statuses:
            parts.append("status=" + ",".join(self.statuses))
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

    @property
    def trace_id(self) -> str | None:
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


_SUMMARY_COLUMNS = (
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

_KEY_UNFINISHED = text(f"{KEYED_PREDICATE} AND {KEY_UNFINISHED_PREDICATE}")


def _blocked_heads_sql(dialect: str) -> str:
    """Stalled keyed rows (ix_outbox_events_key_stalled) that are the head of their key.

    In the NOT EXISTS, unqualified names are the inner table's (p).
    """
    stalled = "outbox_events AS e"
    if dialect == "sqlite":  # its planner prefers the status index, which holds every dead letter
        stalled += " INDEXED BY ix_outbox_events_key_stalled"
    return f"""
SELECT e.ordering_key, e.id, e.status, e.event_type, e.last_error, e.dead_letter_reason,
       e.created_at, e.seq
FROM {stalled}
WHERE {KEYED_PREDICATE} AND {KEY_STALLED_PREDICATE}
AND NOT EXISTS (
    SELECT 1 FROM outbox_events AS p
    WHERE p.ordering_key = e.ordering_key AND p.seq < e.seq
    AND {KEYED_PREDICATE} AND {KEY_UNFINISHED_PREDICATE}
)
"""


def _filtered(stmt: Select[Any], flt: EventFilter) -> Select[Any]:
    if flt.statuses:
        unknown = set(flt.statuses) - set(STATUSES)
        if unknown:
            from engine.errors import ConfigurationError

            raise ConfigurationError(
                f"unknown status {sorted(unknown)[0]!r}: use one of {', '.join(STATUSES)}"
            )
        stmt = stmt.where(t.c.status.in_(flt.statuses))
    if flt.event_type:
        stmt = stmt.where(t.c.event_type == flt.event_type)
    if flt.tenant_id:
        stmt = stmt.where(t.c.tenant_id == flt.tenant_id)
    if flt.aggregate_id:
        stmt = stmt.where(t.c.aggregate_id == flt.aggregate_id)
    if flt.ordering_key:
        stmt = stmt.where(t.c.ordering_key == flt.ordering_key, _KEY_UNFINISHED)
    return stmt


class OutboxInsights:
    """Read-only questions about an outbox database, answered with indexed queries."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        clock: Clock = utc_now,
        recent_window_seconds: float = 300.0,
        stale_after_seconds: float = 30.0,
        retention_seconds: float | None = None,
    ) -> None:
        self._engine = read_only_engine(engine)
        self._clock = clock
        self.recent_window_seconds = recent_window_seconds
        self.stale_after_seconds = stale_after_seconds
        self.retention_seconds = retention_seconds

    async def overview(self) -> OverviewSnapshot:
        now = self._clock()
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            counts = {}
            for status in STATUSES:  # one indexed count each beats a GROUP BY scan
                counts[status] = await _scalar(
                    conn, select(func.count()).select_from(t).where(t.c.status == status)
                )
            recent_since = now - timedelta(seconds=self.recent_window_seconds)
            published_recent = await _scalar(
                conn,
                select(func.count())
                .select_from(t)
                .where(t.c.status == PUBLISHED, t.c.published_at >= recent_since),
            )
            oldest = await _oldest_due(conn)
            stuck = await _scalar(
                conn,
                select(func.count())
                .select_from(t)
                .where(t.c.status == PUBLISHING, t.c.locked_until < now),
            )
            awaiting_purge = None
            if self.retention_seconds is not None:
                cutoff = now - timedelta(seconds=self.retention_seconds)
                awaiting_purge = await _scalar(
                    conn,
                    select(func.count())
                    .select_from(t)
                    .where(t.c.status == PUBLISHED, t.c.published_at < cutoff),
                )
            heartbeats = await self._heartbeats(conn, now)
            unserved = await _unserved(conn, heartbeats, now)
            blocked = (
                await conn.execute(
                    text(
                        "SELECT count(*), min(created_at) "
                        f"FROM ({_blocked_heads_sql(conn.dialect.name)}) AS heads"
                    ).columns(column("n", Integer), column("oldest", UtcDateTime()))
                )
            ).one()
        return OverviewSnapshot(
            taken_at=now,
            counts=counts,
            published_recent=published_recent,
            recent_window_seconds=self.recent_window_seconds,
            oldest_pending_at=oldest,
            stuck_publishing=stuck,
            awaiting_purge=awaiting_purge,
            retention_seconds=self.retention_seconds,
            heartbeats=heartbeats,
            blocked_keys=int(blocked.n or 0),
            oldest_blocked_head_at=blocked.oldest,
            unserved=unserved,
        )

    async def top_types(self, *, limit: int = 10) -> list[TypeCounts]:
        """The ``limit`` event types with the most undelivered events, most first.

        Pending, failed and dead letters are counted inside ix_outbox_events_type_backlog
        (an index-only scan of the backlog, never of published rows); publishing rows
        through the small in-flight index.
        """
        if limit < 1:
            from engine.errors import ConfigurationError

            raise ConfigurationError(f"limit must be at least 1, got {limit}")
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            found: dict[str, Counter[str]] = {}
            for statement in top_types_statements():
                for status, event_type, n in await conn.execute(statement):
                    found.setdefault(event_type, Counter())[status] += int(n)
        ranked = sorted(found.items(), key=lambda item: (-item[1].total(), item[0]))
        return [
            TypeCounts(event_type, {s: counts[s] for s in TYPE_STATUSES})
            for event_type, counts in ranked[:limit]
        ]

    async def blocked_keys(self, *, limit: int = 50) -> list[BlockedKey]:
        """Keys held back by a failed or dead-lettered head, oldest head first."""
        now = self._clock()
        heads_sql = _blocked_heads_sql(self._engine.dialect.name)
        heads_stmt = text(f"{heads_sql} ORDER BY e.created_at, e.seq LIMIT :limit").columns(
            column("ordering_key", Text),
            column("id", Text),
            column("status", Text),
            column("event_type", Text),
            column("last_error", Text),
            column("dead_letter_reason", Text),
            column("created_at", UtcDateTime()),
            column("seq", Integer),
        )
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            heads = (await conn.execute(heads_stmt, {"limit": limit})).all()
            found = []
            for head in heads:
                waiting = await _key_count(conn, head.ordering_key, t.c.seq > head.seq)
                found.append(
                    BlockedKey(
                        ordering_key=head.ordering_key,
                        head_id=head.id,
                        head_status=head.status,
                        head_event_type=head.event_type,
                        head_error=head.dead_letter_reason or head.last_error,
                        head_created_at=head.created_at,
                        head_age_seconds=max(0.0, (now - head.created_at).total_seconds()),
                        waiting=waiting,
                    )
                )
        return found

    async def waiting_behind(self, event_id: str) -> int:
        """Undelivered events of ``event_id``'s key written after it (0 when unordered)."""
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            row = (
                await conn.execute(select(t.c.ordering_key, t.c.seq).where(t.c.id == event_id))
            ).first()
            if row is None or row.ordering_key is None:
                return 0
            return await _key_count(conn, row.ordering_key, t.c.seq > row.seq)

    async def heartbeats(self) -> list[HeartbeatView]:
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            return await self._heartbeats(conn, self._clock())

    async def _heartbeats(self, conn: AsyncConnection, now: datetime) -> list[HeartbeatView]:
        result = await conn.execute(
            select(process_heartbeats).order_by(
                process_heartbeats.c.last_seen_at.desc(), process_heartbeats.c.instance_id
            )
        )
        views = []
        for hb in result.mappings():
            age = max(0.0, (now - hb["last_seen_at"]).total_seconds())
            if hb["state"] == "stopped":
                state = STOPPED
            elif age > self.stale_after_seconds:
                state = STALE
            else:
                state = ALIVE
            details = hb["details"] if isinstance(hb["details"], Mapping) else {}
            views.append(
                HeartbeatView(
                    instance_id=hb["instance_id"],
                    kind=hb["kind"],
                    host=hb["host"],
                    pid=int(hb["pid"]),
                    state=state,
                    started_at=hb["started_at"],
                    last_seen_at=hb["last_seen_at"],
                    last_seen_age_seconds=age,
                    details=details,
                )
            )
        return views

    async def events_page(
        self, flt: EventFilter | None = None, *, limit: int = 50, before: str | None = None
    ) -> EventPage:
        """Newest first, ``limit`` at a time; ``before`` is the previous page's cursor."""
        flt = flt or EventFilter()
        stmt = _filtered(select(*_SUMMARY_COLUMNS), flt)
        if before is not None:
            stmt = stmt.where(t.c.id < before)
        stmt = stmt.order_by(t.c.id.desc()).limit(limit + 1)
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            rows = (await conn.execute(stmt)).mappings().all()
        events = [EventSummary(**dict(r)) for r in rows[:limit]]
        return EventPage(events=events, has_more=len(rows) > limit)

    async def dead_letters(
        self,
        *,
        tenant_id: str | None = None,
        event_type: str | None = None,
        limit: int = 100,
        before: str | None = None,
    ) -> EventPage:
        flt = EventFilter(statuses=(DEAD_LETTER,), event_type=event_type, tenant_id=tenant_id)
        return await self.events_page(flt, limit=limit, before=before)

    async def match_summary(self, flt: EventFilter) -> MatchSummary:
        stmt = _filtered(select(t.c.event_type, func.count()), flt).group_by(t.c.event_type)
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            by_type = Counter({row[0]: int(row[1]) for row in await conn.execute(stmt)})
        return MatchSummary(total=sum(by_type.values()), by_type=dict(by_type.most_common()))

    async def match_events(self, flt: EventFilter) -> MatchSummary:
        """The ids a filter matches now, with their counts by type, from one query."""
        stmt = _filtered(select(t.c.id, t.c.event_type), flt).order_by(t.c.id)
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        by_type = Counter(row[1] for row in rows)
        return MatchSummary(
            total=len(rows), by_type=dict(by_type.most_common()), ids=tuple(r[0] for r in rows)
        )

    async def matching_ids(self, flt: EventFilter, *, limit: int | None = None) -> list[str]:
        stmt = _filtered(select(t.c.id), flt).order_by(t.c.id)
        if limit is not None:
            stmt = stmt.limit(limit)
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            return list((await conn.execute(stmt)).scalars())

    async def event_detail(self, event_id: str) -> EventDetail:
        columns = [c for c in t.c if c.name != "payload"]
        raw = type_coerce(t.c.payload, Text).label("payload")
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            row = (
                (await conn.execute(select(*columns, raw).where(t.c.id == event_id)))
                .mappings()
                .first()
            )
            if row is None:
                raise EventNotFoundError(f"no outbox event with id {event_id!r}")
            replays = await _all(
                conn,
                select(replay_log)
                .where(replay_log.c.event_id == event_id)
                .order_by(replay_log.c.id),
            )
            runs = await _all(
                conn,
                select(handler_runs)
                .where(handler_runs.c.event_id == event_id)
                .order_by(handler_runs.c.handler_key),
            )
            effects = await _all(
                conn,
                select(side_effects)
                .where(side_effects.c.event_id == event_id)
                .order_by(side_effects.c.id),
            )
            earlier = None
            if row["ordering_key"] is not None:
                earlier = await _key_count(conn, row["ordering_key"], t.c.seq < row["seq"])
        values = dict(row)
        payload: Any = values.pop("payload")
        payload_error = None
        if isinstance(payload, str | bytes):
            try:
                payload = json.loads(payload)
            except ValueError as exc:
                payload_error = f"corrupt payload: {exc}"
        return EventDetail(values, payload, payload_error, replays, runs, effects, earlier)


async def _unserved(
    conn: AsyncConnection, heartbeats: Sequence[HeartbeatView], now: datetime
) -> list[UnservedType]:
    """Waiting events by type that no live dispatcher claims (see UnservedType).

    Judged only while some live dispatcher says what it serves: with none alive,
    everything waits and the dispatcher panel already says so. Reads the waiting
    rows of unserved types only, through the status index.
    """
    alive = [hb for hb in heartbeats if hb.state == ALIVE and hb.kind == "dispatcher"]
    if not alive or any(hb.serves is None for hb in alive):
        return []  # none alive, or one from before "serves" that claims every type
    served = sorted({t for hb in alive for t in hb.serves or ()})
    stmt = (
        select(t.c.event_type, func.count().label("n"), func.min(t.c.created_at).label("oldest"))
        .where(t.c.status.in_((PENDING, FAILED)), t.c.event_type.not_in(served))
        .group_by(t.c.event_type)
        .order_by(t.c.event_type)
    )
    return [
        UnservedType(
            event_type=row.event_type,
            count=int(row.n),
            oldest_created_at=row.oldest,
            oldest_age_seconds=max(0.0, (now - row.oldest).total_seconds()),
        )
        for row in (await conn.execute(stmt)).all()
    ]


def oldest_due_statements(dialect: str) -> tuple[Select[Any], TextualSelect]:
    """The two probes of "oldest pending": the first never-replayed pending row by id
    (ix_outbox_events_status_id), and the earliest replay among the replayed pending
    rows (ix_outbox_events_replayed_pending, which holds only those).

    The first walks past replayed pending rows with a lower id: at most as many as the
    replayed-pending index holds.
    """
    created = (
        select(t.c.created_at)
        .where(t.c.status == PENDING, t.c.last_replayed_at.is_(None))
        .order_by(t.c.id)
        .limit(1)
    )
    table = "outbox_events"
    if dialect == "sqlite":  # without statistics its planner prefers the status index
        table += " INDEXED BY ix_outbox_events_replayed_pending"
    replayed = text(
        f"SELECT last_replayed_at FROM {table} WHERE {REPLAYED_PENDING_PREDICATE} "
        "ORDER BY last_replayed_at LIMIT 1"
    ).columns(column("last_replayed_at", UtcDateTime()))
    return created, replayed


async def _oldest_due(conn: AsyncConnection) -> datetime | None:
    """When the longest-waiting pending event became due: created, or last replayed.

    A replayed 40-day-old dead letter has waited since its replay, not for 40 days.
    """
    created, replayed = oldest_due_statements(conn.dialect.name)
    found = [
        (await conn.execute(created)).scalar_one_or_none(),
        (await conn.execute(replayed)).scalar_one_or_none(),
    ]
    return min((f for f in found if f is not None), default=None)


def top_types_statements() -> tuple[Select[Any], Select[Any]]:
    """(status, event_type, count) rows: the backlog statuses, then the rows in flight."""
    backlog = (
        select(t.c.status, t.c.event_type, func.count())
        .where(text(BACKLOG_PREDICATE))
        .group_by(t.c.status, t.c.event_type)
    )
    in_flight = (  # locked_by is set exactly while a row is publishing (engine.schema)
        select(literal(PUBLISHING), t.c.event_type, func.count())
        .where(text(IN_FLIGHT_PREDICATE))
        .group_by(t.c.event_type)
    )
    return backlog, in_flight


async def _scalar(conn: AsyncConnection, stmt: Select[Any]) -> int:
    return int((await conn.execute(stmt)).scalar_one())


async def _key_count(conn: AsyncConnection, key: str, where: Any) -> int:
    """Undelivered events of one key matching ``where`` (ix_outbox_events_key_order)."""
    stmt = (
        select(func.count()).select_from(t).where(t.c.ordering_key == key, where, _KEY_UNFINISHED)
    )
    return await _scalar(conn, stmt)


async def _all(conn: AsyncConnection, stmt: Select[Any]) -> list[dict[str, Any]]:
    return [dict(r) for r in (await conn.execute(stmt)).mappings()]
