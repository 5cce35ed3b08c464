"""The overview's snapshot type and its "oldest pending" probes (``insights`` asks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, column, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.selectable import TextualSelect

from engine.operating.dispatch_health import ALIVE, HeartbeatView, UnservedType
from engine.operating.published_counts import PublishedMark
from engine.running.lag import LagSummary, merged_lag
from engine.storage.schema import (
    INBOUND_PREDICATE,
    PENDING,
    REPLAYED_PENDING_PREDICATE,
    UtcDateTime,
    outbox_events,
)

__all__ = [
    "OverviewSnapshot",
    "inbound_rows",
    "inbound_rows_statement",
    "oldest_due",
    "oldest_due_statements",
]

t = outbox_events


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
    # Pending or failed events behind a dead-lettered head: they wait for an operator.
    held_by_dead_letters: int = 0
    # Waiting events of types no live dispatcher serves (empty while none is alive).
    unserved: Sequence[UnservedType] = ()
    # When counts["published"] and awaiting_purge were last counted in full: taken_at for
    # overview(); a live_overview carries them from that recount, plus what was published
    # since (rows the retention purge deleted since are subtracted at the next recount).
    published_counted_at: datetime | None = None
    # live_overview only: events published since the ``since`` mark it was given (None
    # without one), and the mark to give the next live overview.
    published_since: int | None = None
    mark: PublishedMark | None = None
    # The inbound events the inbox (engine.inbox) remembers, refusing copies: counted by
    # overview() only (they grow with the dedup window); None from a live overview.
    inbound_rows: int | None = None

    @property
    def oldest_pending_age_seconds(self) -> float | None:
        if self.oldest_pending_at is None:
            return None
        return max(0.0, (self.taken_at - self.oldest_pending_at).total_seconds())

    @property
    def lag(self) -> LagSummary | None:
        """The last minute's lag over the live dispatchers that measure it (metrics on);
        None when none does."""
        return merged_lag(hb.details for hb in self.heartbeats if hb.state == ALIVE)

    @property
    def oldest_blocked_head_age_seconds(self) -> float | None:
        if self.oldest_blocked_head_at is None:
            return None
        return max(0.0, (self.taken_at - self.oldest_blocked_head_at).total_seconds())


def inbound_rows_statement() -> Select[Any]:
    """Inbound events the inbox remembers (refusing copies), counted inside
    uq_outbox_events_inbound: its predicate, repeated."""
    return select(func.count()).select_from(t).where(text(INBOUND_PREDICATE))


async def inbound_rows(conn: AsyncConnection) -> int:
    """How many inbound events the inbox remembers now (``inbound_rows_statement``)."""
    return int((await conn.execute(inbound_rows_statement())).scalar_one())


def oldest_due_statements(dialect: str) -> tuple[Select[Any], TextualSelect]:
    """The two probes of "oldest pending": the first never-replayed pending row by id
    (ix_outbox_events_backlog_id), and the earliest replay among the replayed pending
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


async def oldest_due(conn: AsyncConnection) -> datetime | None:
    """When the longest-waiting pending event became due: created, or last replayed.

    A replayed 40-day-old dead letter has waited since its replay, not for 40 days.
    """
    created, replayed = oldest_due_statements(conn.dialect.name)
    found = [
        (await conn.execute(created)).scalar_one_or_none(),
        (await conn.execute(replayed)).scalar_one_or_none(),
    ]
    return min((f for f in found if f is not None), default=None)
