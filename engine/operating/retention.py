"""Delete published events after the retention period, in bounded batches.

Only ``published`` rows are ever deleted: dead letters wait for an operator
(replay or investigation) however old they are, and pending, failed and
publishing rows are live work. With a purged event go its handler-run records
(``outbox_handler_runs``), which exist only to skip handlers that already
succeeded when the event is delivered again, and a published event is never
delivered again. Side-effect records (``outbox_side_effects``) and the replay
log are kept: they are the audit of calls made to external systems and of
operator actions, and outlive the event on purpose.

Each call deletes at most ``batch_size`` rows in one short transaction, oldest
``published_at`` first through the partial index ``ix_outbox_events_published_at``
(``WHERE status = 'published'``), so a large backlog never holds a long lock.

Inbound rows (engine.inbox) have a retention of their own, the inbox's dedup window: a
second delivery of an event is refused only while the row of its first is there. The
local purge leaves an inbound row alone until that window passed too (when it is the
longer one), and ``purge_inbound`` deletes inbound rows past it through
``ix_outbox_events_inbound_published``, which holds only those (when it is the shorter).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Select, delete, or_, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.operating.replay import DEFAULT_DEDUP_WINDOW
from engine.storage.schema import (
    INBOUND_PUBLISHED_PREDICATE,
    PUBLISHED,
    handler_runs,
    outbox_events,
    process_heartbeats,
)

t = outbox_events
DEFAULT_BATCH_SIZE = 500


def purge_candidates(
    older_than: datetime, batch_size: int, *, inbound_older_than: datetime | None = None
) -> Select[tuple[str]]:
    """The oldest published rows past the cut-off, through ix_outbox_events_published_at.

    ``inbound_older_than``: the inbound rows' own cut-off; when it is the earlier one, an
    inbound row must be past it too (its window is the longer).
    """
    stmt = select(t.c.id).where(t.c.status == PUBLISHED, t.c.published_at <= older_than)
    if inbound_older_than is not None and inbound_older_than < older_than:
        stmt = stmt.where(or_(t.c.inbound_id.is_(None), t.c.published_at <= inbound_older_than))
    return stmt.order_by(t.c.published_at).limit(batch_size)


def inbound_purge_candidates(older_than: datetime, batch_size: int) -> Select[tuple[str]]:
    """The oldest published inbound rows past their cut-off, through
    ix_outbox_events_inbound_published: the query repeats its predicate, and SQLite is told
    the index (the published_at index would also give the order, past every local row)."""
    return (
        select(t.c.id)
        .with_hint(t, "INDEXED BY ix_outbox_events_inbound_published", "sqlite")
        .where(text(INBOUND_PUBLISHED_PREDICATE), t.c.published_at <= older_than)
        .order_by(t.c.published_at)
        .limit(batch_size)
    )


# PostgreSQL, in the purge's transaction: never sort for the candidates. With statistics
# from before a drain (every row pending), the planner takes "published" for one row and
# reads it through (status, id) plus a sort, which visits every published row. Without a
# sort only the published_at index gives the order, and it stops at the cut-off (see
# decision 0010).
PURGE_PLAN = text("SET LOCAL enable_sort = off")


async def purge_published(
    engine: AsyncEngine,
    *,
    older_than: datetime,
    batch_size: int = DEFAULT_BATCH_SIZE,
    inbound_older_than: datetime | None = None,
) -> int:
    """Delete up to ``batch_size`` rows published at or before ``older_than`` (an inbound
    row also at or before ``inbound_older_than``, when given); returns how many."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    candidates = purge_candidates(older_than, batch_size, inbound_older_than=inbound_older_than)
    return await _delete(engine, candidates)


async def purge_inbound(
    engine: AsyncEngine, *, older_than: datetime, batch_size: int = DEFAULT_BATCH_SIZE
) -> int:
    """Delete up to ``batch_size`` inbound rows published at or before ``older_than`` (the
    end of their dedup window); returns how many."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    return await _delete(engine, inbound_purge_candidates(older_than, batch_size))


async def _delete(engine: AsyncEngine, candidates: Select[tuple[str]]) -> int:
    """Delete the rows ``candidates`` picks, with their handler-run records."""
    async with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            await conn.execute(PURGE_PLAN)
            # Concurrent purgers (several dispatchers) take disjoint batches without waiting.
            candidates = candidates.with_for_update(skip_locked=True)
        ids = list((await conn.execute(candidates)).scalars())
        if not ids:
            return 0
        await conn.execute(delete(handler_runs).where(handler_runs.c.event_id.in_(ids)))
        result = await conn.execute(delete(t).where(t.c.id.in_(ids), t.c.status == PUBLISHED))
        return int(result.rowcount)


async def purge_heartbeats(engine: AsyncEngine, *, older_than: datetime) -> int:
    """Forget processes not seen since ``older_than`` (stopped or long dead); returns how many.

    Without this every restart (a new ``<host>:<pid>``) would stay in the
    console's dispatcher panel forever.
    """
    async with engine.begin() as conn:
        result = await conn.execute(
            delete(process_heartbeats).where(process_heartbeats.c.last_seen_at < older_than)
        )
        return int(result.rowcount)


def inbound_window(seconds: float | None) -> float:
    """How long inbound rows are kept: ``inbound_retention_seconds`` when set, else the
    default dedup window (``OutboxSettings`` fills the setting from its own window)."""
    return seconds if seconds is not None else DEFAULT_DEDUP_WINDOW.total_seconds()


def retention_cutoff(now: datetime, retention_seconds: float) -> datetime:
    return now - timedelta(seconds=retention_seconds)
