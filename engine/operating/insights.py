"""The read side every front end uses: overview, event pages, details, heartbeats.

The CLI and the console never write SQL; they ask this service. It answers with
the types of two modules, re-exported here: ``engine.operating.event_views`` (the filter,
rows, pages and details an operator browses) and ``engine.operating.dispatch_health`` (who
delivers and what is held back: heartbeats, unserved types, blocked keys). Every query is
served by an index (counts by status, keyset pages by id), so the console stays
responsive with millions of rows, and all reads use deferred transactions so
they never take SQLite's write lock.

Two counts grow with the table rather than with the work: every published row, and
the published rows past the retention. ``overview()`` (``stats``, metrics) counts
them exactly each time. A console refreshing every second asks ``live_overview``
instead: it counts only what is waiting, in flight or failing, and carries the
published figures from the last ``published_totals()`` (a recount the console runs
off its refresh path, every few seconds), adding the events published since that
recount from the ``published_at`` index (``PublishedMark``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, Text, cast, func, literal, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.selectable import TextualSelect

from engine.clock import Clock, utc_now
from engine.errors import EventNotFoundError
from engine.operating import overview
from engine.operating.dispatch_health import (
    ALIVE,
    STALE,
    STOPPED,
    BlockedKey,
    HeartbeatView,
    UnservedType,
    blocked_summary,
    key_count,
    read_blocked_keys,
    read_heartbeats,
    unserved_types,
)
from engine.operating.event_views import (
    SUMMARY_COLUMNS,
    EventDetail,
    EventFilter,
    EventPage,
    EventSummary,
    MatchSummary,
    chain_statement,
    filtered,
    status_clause,
)
from engine.operating.overview import OverviewSnapshot, oldest_due, oldest_due_statements
from engine.operating.published_counts import (
    PublishedMark,
    PublishedTotals,
    count_awaiting_purge,
    count_published_from,
    count_since,
    count_totals,
    published_window_statements,
)
from engine.storage.database import read_only_engine, storage_errors
from engine.storage.payloads import PAYLOAD_TOO_DEEP
from engine.storage.schema import (
    BACKLOG_PREDICATE,
    DEAD_LETTER,
    FAILED,
    LEASED_PREDICATE,
    PENDING,
    PUBLISHED,
    PUBLISHING,
    STATUSES,
    handler_runs,
    outbox_events,
    replay_log,
    side_effects,
)

# Re-exported from their modules in engine.operating: ALIVE, STALE, STOPPED, BlockedKey,
# HeartbeatView and UnservedType (dispatch_health), the Event* types and MatchSummary
# (event_views), OverviewSnapshot and oldest_due_statements (overview), the Published* ones
# (published_counts).
__all__ = [
    "ALIVE",
    "STALE",
    "STOPPED",
    "TYPE_STATUSES",
    "BlockedKey",
    "EventDetail",
    "EventFilter",
    "EventPage",
    "EventSummary",
    "HeartbeatView",
    "MatchSummary",
    "OutboxInsights",
    "OverviewSnapshot",
    "PublishedMark",
    "PublishedTotals",
    "TypeCounts",
    "UnservedType",
    "oldest_due_statements",
    "published_window_statements",
    "stuck_statement",
    "top_types_statements",
]

t = outbox_events


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
        """Everything, counted now: ``published`` and ``awaiting_purge`` included."""
        now = self._clock()
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            totals = await self._totals(conn, now)
            return await self._snapshot(conn, now, totals, carried=False, since=None)

    async def live_overview(
        self, totals: PublishedTotals, *, since: PublishedMark | None = None
    ) -> OverviewSnapshot:
        """The overview without recounting published rows: a console's refresh.

        ``counts["published"]`` is ``totals.published`` plus the rows published since
        ``totals.mark``; ``awaiting_purge`` is counted now while under
        ``AWAITING_PURGE_CAP`` (a purge that keeps up), else the recount's. ``since``
        (the previous live overview's ``mark``) makes ``published_since`` the events
        published in between.
        Every count here is bounded by the work (waiting, in flight, failing, published
        lately), not by the table.
        """
        now = self._clock()
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            return await self._snapshot(conn, now, totals, carried=True, since=since)

    async def published_totals(self) -> PublishedTotals:
        """The published total and the purge backlog, exactly: two counts over the
        published rows (index-only, yet proportional to them)."""
        now = self._clock()
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            return await self._totals(conn, now)

    async def _totals(self, conn: AsyncConnection, now: datetime) -> PublishedTotals:
        return await count_totals(conn, now, self.retention_seconds)

    async def _snapshot(
        self,
        conn: AsyncConnection,
        now: datetime,
        totals: PublishedTotals,
        *,
        carried: bool,
        since: PublishedMark | None,
    ) -> OverviewSnapshot:
        counts = {}
        for status in STATUSES:  # one indexed count each beats a GROUP BY scan
            if status != PUBLISHED:
                counts[status] = await _scalar(
                    conn, select(func.count()).select_from(t).where(status_clause(status))
                )
        recent_since = now - timedelta(seconds=self.recent_window_seconds)
        published_recent = await count_published_from(conn, recent_since)
        published, published_since, mark = totals.published, None, None
        awaiting_purge = totals.awaiting_purge
        if carried:  # add what was published since the recount
            published, published_since, mark = await count_since(conn, totals, since)
            if self.retention_seconds is not None:
                cutoff = now - timedelta(seconds=self.retention_seconds)
                awaiting_purge = await count_awaiting_purge(conn, cutoff, totals)
        counts[PUBLISHED] = published
        counts = {status: counts[status] for status in STATUSES}
        oldest = await oldest_due(conn)
        stuck = await _scalar(conn, stuck_statement(now))
        heartbeats = await self._heartbeats(conn, now)
        unserved = await unserved_types(conn, heartbeats, now)
        blocked = await blocked_summary(conn)
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
            blocked_keys=blocked.keys,
            oldest_blocked_head_at=blocked.oldest_head_at,
            held_by_dead_letters=blocked.held_by_dead_letters,
            unserved=unserved,
            published_counted_at=totals.taken_at,
            published_since=published_since,
            mark=mark,
            inbound_rows=None if carried else await overview.inbound_rows(conn),
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
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            return await read_blocked_keys(conn, now, limit=limit)

    async def waiting_behind(self, event_id: str) -> int:
        """Undelivered events of ``event_id``'s key written after it (0 when unordered)."""
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            row = (
                await conn.execute(select(t.c.ordering_key, t.c.seq).where(t.c.id == event_id))
            ).first()
            if row is None or row.ordering_key is None:
                return 0
            return await key_count(conn, row.ordering_key, t.c.seq > row.seq)

    async def heartbeats(self) -> list[HeartbeatView]:
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            return await self._heartbeats(conn, self._clock())

    async def _heartbeats(self, conn: AsyncConnection, now: datetime) -> list[HeartbeatView]:
        return await read_heartbeats(conn, now, stale_after_seconds=self.stale_after_seconds)

    async def events_page(
        self, flt: EventFilter | None = None, *, limit: int = 50, before: str | None = None
    ) -> EventPage:
        """Newest first, ``limit`` at a time; ``before`` is the previous page's cursor."""
        flt = flt or EventFilter()
        stmt = filtered(select(*SUMMARY_COLUMNS), flt)
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
        stmt = filtered(select(t.c.event_type, func.count()), flt).group_by(t.c.event_type)
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            by_type = Counter({row[0]: int(row[1]) for row in await conn.execute(stmt)})
        return MatchSummary(total=sum(by_type.values()), by_type=dict(by_type.most_common()))

    async def match_events(self, flt: EventFilter) -> MatchSummary:
        """The ids a filter matches now, with their counts by type, from one query."""
        stmt = filtered(select(t.c.id, t.c.event_type), flt).order_by(t.c.id)
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        by_type = Counter(row[1] for row in rows)
        return MatchSummary(
            total=len(rows), by_type=dict(by_type.most_common()), ids=tuple(r[0] for r in rows)
        )

    async def matching_ids(self, flt: EventFilter, *, limit: int | None = None) -> list[str]:
        stmt = filtered(select(t.c.id), flt).order_by(t.c.id)
        if limit is not None:
            stmt = stmt.limit(limit)
        async with storage_errors(self._engine.url), self._engine.connect() as conn:
            return list((await conn.execute(stmt)).scalars())

    async def event_detail(self, event_id: str) -> EventDetail:
        columns = [c for c in t.c if c.name != "payload"]
        # As text on both databases, decoded below: PostgreSQL's jsonb codec would decode
        # it in the driver, where a payload too deep to decode fails the whole query.
        raw = cast(t.c.payload, Text).label("payload")
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
                earlier = await key_count(conn, row["ordering_key"], t.c.seq < row["seq"])
            chain = await _all(conn, chain_statement(row["correlation_id"] or row["id"]))
        values = dict(row)
        payload: Any = values.pop("payload")
        payload_error = None
        if isinstance(payload, str | bytes):
            try:
                payload = json.loads(payload)
            except ValueError as exc:
                payload_error = f"corrupt payload: {exc}"
            except RecursionError:
                payload_error = f"corrupt payload: {PAYLOAD_TOO_DEEP}"
        return EventDetail(values, payload, payload_error, replays, runs, effects, earlier, chain)


def stuck_statement(now: datetime) -> Select[Any]:
    """How many leased rows' lease ran out: the ones a claim reclaims.

    A row is leased exactly while publishing (engine.storage.schema), so no status test: it
    would read each row, where the lease index alone answers (see decisions 0005 and 0032).
    """
    return select(func.count()).select_from(t).where(text(LEASED_PREDICATE), t.c.locked_until < now)


def top_types_statements() -> tuple[Select[Any], Select[Any]]:
    """(status, event_type, count) rows: the backlog statuses, then the rows in flight."""
    backlog = (
        select(t.c.status, t.c.event_type, func.count())
        .where(text(BACKLOG_PREDICATE))
        .group_by(t.c.status, t.c.event_type)
    )
    in_flight = (  # a row is leased exactly while it is publishing (engine.storage.schema)
        select(literal(PUBLISHING), t.c.event_type, func.count())
        .where(text(LEASED_PREDICATE))
        .group_by(t.c.event_type)
    )
    return backlog, in_flight


async def _scalar(conn: AsyncConnection, stmt: Select[Any] | TextualSelect) -> int:
    return int((await conn.execute(stmt)).scalar_one())


async def _all(conn: AsyncConnection, stmt: Select[Any]) -> list[dict[str, Any]]:
    return [dict(r) for r in (await conn.execute(stmt)).mappings()]
