"""Counting published rows without counting them all: the console's published figures.

The published total and the purge backlog grow with the table (most of a large outbox is
published rows), so counting them takes a scan of their index however it is indexed (see
decision 0032). ``count_totals`` does that once (one statement, so one snapshot on
PostgreSQL too) and leaves a ``PublishedMark``; ``count_since`` then counts only the
rows published after the mark, and the rows published since the previous refresh,
through ix_outbox_events_published_at. Published rows are final and only the
retention purge, of old rows, deletes them, so the recount plus the rows past its
mark is the total, short of what the purge deleted since (the next recount has it).
The purge backlog is counted live while it is small (``AWAITING_PURGE_CAP``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Integer, bindparam, column, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import TextClause
from sqlalchemy.sql.selectable import TextualSelect

from engine.storage.schema import PUBLISHED, UtcDateTime

__all__ = [
    "AWAITING_PURGE_CAP",
    "MARK_MARGIN_SECONDS",
    "PublishedMark",
    "PublishedTotals",
    "PublishedWindow",
    "count_awaiting_purge",
    "count_published_from",
    "count_since",
    "count_totals",
    "published_window_statements",
]

#: How far before a recount its mark is set: events whose ``published_at`` is later are
#: counted again at each live overview. It covers the lag between a completion's
#: timestamp and its commit and the clock skew of NTP-synced hosts, with room to spare.
MARK_MARGIN_SECONDS = 30.0


#: Up to this many rows past the retention are counted at each live overview: a purge
#: that keeps up leaves fewer, so the figure is exact and current. A larger backlog (the
#: purge is off or behind) is the last recount's, at most a recount interval old.
AWAITING_PURGE_CAP = 10_000


@dataclass(frozen=True, slots=True)
class PublishedMark:
    """``seen`` rows were published with ``published_at >= at`` when it was taken.

    Published rows are final (only the retention purge, of old rows, deletes them), so a
    later count over the same range, minus ``seen``, is what was published in between.
    """

    at: datetime
    seen: int


@dataclass(frozen=True, slots=True)
class PublishedTotals:
    """The published total and the purge backlog, counted exactly at ``taken_at``."""

    taken_at: datetime
    published: int
    awaiting_purge: int | None
    mark: PublishedMark  # the same snapshot's count of the rows published since a margin


@dataclass(frozen=True, slots=True)
class PublishedWindow:
    """Counts of published rows by ``published_at``, through ix_outbox_events_published_at.

    The status is written into the SQL, never bound: a partial index serves only a query
    whose WHERE implies the index's, which neither SQLite (at prepare time) nor a
    PostgreSQL generic plan can see through a parameter. SQLite is also told the index:
    from its statistics it would walk the status index instead, every published row for a
    window of minutes (see decision 0032).
    """

    since: TextualSelect  # :since and later
    # earlier than :before, up to AWAITING_PURGE_CAP of them (the purge backlog, live)
    before_capped: TextualSelect
    since_two: TextClause  # (:first and later, :second and later) in one snapshot
    # (every published row, :mark and later, earlier than :before): the recount, one scan
    totals: TextClause


@functools.cache  # built once per dialect: every console refresh runs two or three of them
def published_window_statements(dialect: str) -> PublishedWindow:
    table = "outbox_events"
    if dialect == "sqlite":
        table += " INDEXED BY ix_outbox_events_published_at"
    where = f"FROM {table} WHERE status = '{PUBLISHED}'"

    def count(sql: str, *names: str) -> TextualSelect:
        stmt = text(sql).bindparams(*(bindparam(n, type_=UtcDateTime()) for n in names))
        return stmt.columns(column("n", Integer()))

    return PublishedWindow(
        since=count(f"SELECT count(*) AS n {where} AND published_at >= :since", "since"),
        before_capped=count(
            f"SELECT count(*) AS n FROM (SELECT 1 {where} AND published_at < :before"
            f" LIMIT {AWAITING_PURGE_CAP}) AS capped",
            "before",
        ),
        since_two=text(
            "SELECT sum(CASE WHEN published_at >= :first THEN 1 ELSE 0 END),"
            " sum(CASE WHEN published_at >= :second THEN 1 ELSE 0 END)"
            f" {where} AND published_at >= "
            + ("least(:first, :second)" if dialect == "postgresql" else "min(:first, :second)")
        ).bindparams(
            bindparam("first", type_=UtcDateTime()), bindparam("second", type_=UtcDateTime())
        ),
        totals=text(
            "SELECT count(*), sum(CASE WHEN published_at >= :mark THEN 1 ELSE 0 END),"
            f" sum(CASE WHEN published_at < :before THEN 1 ELSE 0 END) {where}"
        ).bindparams(
            bindparam("mark", type_=UtcDateTime()), bindparam("before", type_=UtcDateTime())
        ),
    )


async def count_totals(
    conn: AsyncConnection, now: datetime, retention_seconds: float | None
) -> PublishedTotals:
    """The published total, its mark and the purge backlog, in one statement: a row
    committed meanwhile is in all three or in none (and then past the mark)."""
    mark_at = now - timedelta(seconds=MARK_MARGIN_SECONDS)
    # Without a retention nothing is before the cutoff: the sum counts no row.
    cutoff = now - timedelta(seconds=retention_seconds or 0)
    stmt = published_window_statements(conn.dialect.name).totals
    row = (await conn.execute(stmt.bindparams(mark=mark_at, before=cutoff))).one()
    published, seen, before = (int(v or 0) for v in row)
    awaiting_purge = before if retention_seconds is not None else None
    return PublishedTotals(now, published, awaiting_purge, PublishedMark(mark_at, seen))


async def count_since(
    conn: AsyncConnection, totals: PublishedTotals, since: PublishedMark | None
) -> tuple[int, int | None, PublishedMark]:
    """(the published total now, the events published since ``since`` or None without
    it, the mark for the next call), from one range of the published_at index."""
    previous = since if since is not None else totals.mark
    both = published_window_statements(conn.dialect.name).since_two
    row = (await conn.execute(both.bindparams(first=totals.mark.at, second=previous.at))).one()
    from_recount, from_previous = int(row[0] or 0), int(row[1] or 0)
    published = totals.published + max(0, from_recount - totals.mark.seen)
    published_since = None if since is None else max(0, from_previous - since.seen)
    return published, published_since, PublishedMark(totals.mark.at, from_recount)


async def count_awaiting_purge(
    conn: AsyncConnection, cutoff: datetime, totals: PublishedTotals
) -> int | None:
    """Published rows older than ``cutoff``: counted now up to ``AWAITING_PURGE_CAP``,
    beyond it the recount's figure (None when the recount had no retention)."""
    if totals.awaiting_purge is None:
        return None
    stmt = published_window_statements(conn.dialect.name).before_capped
    now = int((await conn.execute(stmt.bindparams(before=cutoff))).scalar_one())
    return now if now < AWAITING_PURGE_CAP else max(now, totals.awaiting_purge)


async def count_published_from(conn: AsyncConnection, since: datetime) -> int:
    """Rows published at ``since`` or later (the "published recently" window)."""
    stmt = published_window_statements(conn.dialect.name).since.bindparams(since=since)
    return int((await conn.execute(stmt)).scalar_one())
