"""Who delivers and what is held back: heartbeats, unserved types, blocked ordering keys.

The read side of ``engine.operating.insights`` for the dispatcher panel and the blocked-keys
view: each dispatcher process as an operator sees it (alive, stale or stopped), the
waiting event types no live dispatcher serves, and the ordering keys whose head (a
failed or dead-lettered event) holds the rest of the key back. ``OutboxInsights``
asks these on its read-only connections; every query is served by an index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Integer, Select, Text, column, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.storage.schema import (
    DEAD_LETTER,
    FAILED,
    KEY_STALLED_PREDICATE,
    KEY_TURN,
    KEY_UNFINISHED_PREDICATE,
    KEYED_PREDICATE,
    PENDING,
    UtcDateTime,
    outbox_events,
    process_heartbeats,
    status_is_one_of,
)

t = outbox_events
ALIVE, STALE, STOPPED = "alive", "stale", "stopped"
# The undelivered rows of an ordering key (ix_outbox_events_key_order on SQLite,
# ix_outbox_events_key_turn on PostgreSQL).
KEY_UNFINISHED = text(f"{KEYED_PREDICATE} AND {KEY_UNFINISHED_PREDICATE}")
# PostgreSQL's key index keeps a key's rows in flight apart from its rows at rest (the
# claim reads the first ones first): a range of a key in write order is a range within
# each part, so a query over one reads it as two, each bounded by ``seq``.
_PG_KEY_TURNS = (f"{KEY_TURN} = 0", f"{KEY_TURN} = 1")


def key_turns(dialect: str) -> tuple[str, ...]:
    """The parts a query over a range of one key's rows reads, one SQL term each (on
    SQLite a single part, a term that is always true)."""
    return _PG_KEY_TURNS if dialect == "postgresql" else ("true",)


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
    def is_consumer(self) -> bool:
        """An inbox consumer (engine.inbox), not a dispatcher."""
        return self.kind == "consumer"

    @property
    def queue(self) -> str | None:
        """The queue an inbox consumer takes messages from (None for a dispatcher)."""
        value = self.details.get("queue")
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


# -- heartbeats and unserved types -----------------------------------------------------


async def read_heartbeats(
    conn: AsyncConnection, now: datetime, *, stale_after_seconds: float
) -> list[HeartbeatView]:
    """Every heartbeat row, most recently seen first; silent longer than ``stale_after_seconds``
    is stale."""
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
        elif age > stale_after_seconds:
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


async def unserved_types(
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


# -- blocked ordering keys -------------------------------------------------------------


def blocked_heads_sql(dialect: str) -> str:
    """Stalled keyed rows (ix_outbox_events_key_stalled) that are the head of their key.

    In the NOT EXISTS, unqualified names are the inner table's (p).
    """
    stalled = "outbox_events AS e"
    if dialect == "sqlite":  # its planner prefers the status index, which holds every dead letter
        stalled += " INDEXED BY ix_outbox_events_key_stalled"
    none_before = "".join(
        f"""
AND NOT EXISTS (
    SELECT 1 FROM outbox_events AS p
    WHERE p.ordering_key = e.ordering_key AND {turn} AND p.seq < e.seq
    AND {KEYED_PREDICATE} AND {KEY_UNFINISHED_PREDICATE}
)"""
        for turn in key_turns(dialect)
    )
    return f"""
SELECT e.ordering_key, e.id, e.status, e.event_type, e.last_error, e.dead_letter_reason,
       e.created_at, e.seq
FROM {stalled}
WHERE {KEYED_PREDICATE} AND {KEY_STALLED_PREDICATE}{none_before}
"""


class BlockedSummary(NamedTuple):
    """The blocked ordering keys at a glance."""

    keys: int
    oldest_head_at: datetime | None
    # Pending or failed events queued behind a dead-lettered head. They cannot drain on
    # their own: each waits for an operator to replay or skip its key's head (a failed
    # head's key drains once its retry succeeds, so those are not counted).
    held_by_dead_letters: int


def blocked_summary_sql(dialect: str) -> str:
    """How many keys are blocked, the oldest head, and what dead-lettered heads hold.

    One range of the key index per dead-lettered head (two on PostgreSQL), over the rows
    after it (in the inner query, unqualified names are its own table's, w).
    """
    # The index's own predicate, as it is spelled (SQLite uses a partial index only for a
    # query that repeats it), then narrowed to what waits: pending or failed.
    waiting = status_is_one_of(PENDING, FAILED)
    held = " + ".join(
        f"""(SELECT count(*) FROM outbox_events AS w
    WHERE w.ordering_key = heads.ordering_key AND {turn} AND w.seq > heads.seq
    AND {KEYED_PREDICATE} AND {KEY_UNFINISHED_PREDICATE} AND ({waiting}))"""
        for turn in key_turns(dialect)
    )
    return f"""SELECT count(*) AS n, min(created_at) AS oldest,
    coalesce(sum(CASE WHEN status = '{DEAD_LETTER}' THEN {held} ELSE 0 END), 0) AS held
FROM ({blocked_heads_sql(dialect)}) AS heads"""


async def blocked_summary(conn: AsyncConnection) -> BlockedSummary:
    """How many keys are blocked, the oldest blocking head, and the events that wait for
    an operator behind dead-lettered heads."""
    row = (
        await conn.execute(
            text(blocked_summary_sql(conn.dialect.name)).columns(
                column("n", Integer), column("oldest", UtcDateTime()), column("held", Integer)
            )
        )
    ).one()
    return BlockedSummary(int(row.n or 0), row.oldest, int(row.held or 0))


async def read_blocked_keys(
    conn: AsyncConnection, now: datetime, *, limit: int
) -> list[BlockedKey]:
    """Keys held back by a failed or dead-lettered head, oldest head first."""
    heads_sql = blocked_heads_sql(conn.dialect.name)
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
    heads = (await conn.execute(heads_stmt, {"limit": limit})).all()
    found = []
    for head in heads:
        waiting = await key_count(conn, head.ordering_key, t.c.seq > head.seq)
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


def key_count_statements(dialect: str, key: str, where: Any) -> list[Select[Any]]:
    """The counts ``key_count`` adds up: one range of the key index per part."""
    return [
        select(func.count())
        .select_from(t)
        .where(t.c.ordering_key == key, text(turn), where, KEY_UNFINISHED)
        for turn in key_turns(dialect)
    ]


async def key_count(conn: AsyncConnection, key: str, where: Any) -> int:
    """Undelivered events of one key matching ``where``, a range of ``seq``."""
    found = 0
    for stmt in key_count_statements(conn.dialect.name, key, where):
        found += int((await conn.execute(stmt)).scalar_one())
    return found
