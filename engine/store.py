"""Every statement that changes an outbox row, in one place.

Each state change is a conditional update: a claim only takes rows that are
due and unleased, and every completion re-checks the dispatcher's lease
(status, holder, fencing token ``claim_version`` and expiry). A completion that
matches nothing is a lost lease and changes nothing.

The one dialect difference is the claim. PostgreSQL locks candidate rows with
``FOR UPDATE SKIP LOCKED`` in a CTE so concurrent dispatchers take disjoint
batches without waiting. SQLite has no row locks (SQLAlchemy emits no FOR
UPDATE there), so the claim is one ``UPDATE ... WHERE id IN (SELECT ...)
RETURNING`` statement inside a ``BEGIN IMMEDIATE`` transaction: the database
write lock makes select-and-update atomic across processes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Text,
    and_,
    case,
    exists,
    or_,
    select,
    text,
    tuple_,
    type_coerce,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.schema import (
    ACTIVE_PREDICATE,
    DEAD_LETTER,
    FAILED,
    PENDING,
    PUBLISHED,
    PUBLISHING,
    outbox_events,
)

t = outbox_events
_ERROR_LIMIT = 4000


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    """A row this dispatcher holds: its columns and the fencing token it was claimed with."""

    values: Mapping[str, Any]
    raw_payload: Any

    @property
    def event_id(self) -> str:
        return str(self.values["id"])

    @property
    def claim_version(self) -> int:
        return int(self.values["claim_version"])

    @property
    def attempt_count(self) -> int:
        return int(self.values["attempt_count"])

    @property
    def max_attempts(self) -> int:
        return int(self.values["max_attempts"])

    def decoded_payload(self) -> Any:
        """The payload, decoded here so one corrupt row cannot break a whole batch."""
        if isinstance(self.raw_payload, str | bytes):
            return json.loads(self.raw_payload)
        return self.raw_payload


def truncate_error(message: str) -> str:
    return message if len(message) <= _ERROR_LIMIT else message[: _ERROR_LIMIT - 1] + "…"


def _claim_columns() -> list[Any]:
    # The payload comes back as raw text (on SQLite) and is decoded per row.
    return [c for c in t.c if c.name != "payload"] + [
        type_coerce(t.c.payload, Text).label("payload")
    ]


def _waiting(now: datetime) -> Any:
    """Pending or failed rows that are due and not leased."""
    return and_(
        text(ACTIVE_PREDICATE),
        t.c.status.in_((PENDING, FAILED)),
        or_(t.c.next_retry_at.is_(None), t.c.next_retry_at <= now),
        or_(t.c.locked_until.is_(None), t.c.locked_until < now),
    )


def _abandoned(now: datetime) -> Any:
    """Rows whose dispatcher's lease ran out mid-delivery (it crashed or hung)."""
    return and_(t.c.status == PUBLISHING, t.c.locked_until < now)


async def claim_batch(
    conn: AsyncConnection,
    *,
    dispatcher_id: str,
    batch_size: int,
    lease: timedelta,
    now: datetime,
) -> list[ClaimedRow]:
    """Claim up to ``batch_size`` due rows in one statement; oldest first.

    A row whose lease expired is reclaimed alone, one per claim, ahead of waiting
    rows: if it is what killed the last dispatcher, it can only spend its own
    attempts, never those of a whole batch of innocent rows claimed with it.
    """
    abandoned = select(t.c.id).where(_abandoned(now)).order_by(t.c.locked_until).limit(1)
    if conn.dialect.name == "postgresql":
        abandoned = abandoned.with_for_update(skip_locked=True)
    abandoned_cte = abandoned.cte("abandoned")
    waiting = (
        select(t.c.id)
        .where(_waiting(now), ~exists(select(abandoned_cte.c.id)))
        .order_by(t.c.id)
        .limit(batch_size)
    )
    if conn.dialect.name == "postgresql":
        waiting = waiting.with_for_update(skip_locked=True)
    waiting_cte = waiting.cte("waiting")
    claimable = union_all(select(abandoned_cte.c.id), select(waiting_cte.c.id))
    stmt = (
        update(t)
        .where(t.c.id.in_(claimable))
        .values(
            status=PUBLISHING,
            locked_by=dispatcher_id,
            locked_until=now + lease,
            claim_version=t.c.claim_version + 1,
            attempt_count=t.c.attempt_count + 1,
        )
    )
    result = await conn.execute(stmt.returning(*_claim_columns()))
    rows = [ClaimedRow(values=dict(row), raw_payload=row["payload"]) for row in result.mappings()]
    rows.sort(key=lambda r: r.event_id)
    return rows


@dataclass(frozen=True, slots=True)
class Fence:
    """Who completes, and when: a completion holds only if the lease is still this one's."""

    dispatcher_id: str
    now: datetime


def _held(fence: Fence) -> Any:
    return and_(
        t.c.status == PUBLISHING,
        t.c.locked_by == fence.dispatcher_id,
        t.c.locked_until > fence.now,
    )


_RELEASE_LOCK = {"locked_by": None, "locked_until": None}


async def mark_published(
    conn: AsyncConnection,
    claims: Sequence[tuple[str, int]],
    fence: Fence,
) -> set[str]:
    """Complete a batch as published; returns the ids whose lease still held."""
    if not claims:
        return set()
    stmt = (
        update(t)
        .where(tuple_(t.c.id, t.c.claim_version).in_(list(claims)), _held(fence))
        .values(
            status=PUBLISHED,
            published_at=fence.now,
            last_error=None,
            next_retry_at=None,
            **_RELEASE_LOCK,
        )
        .returning(t.c.id)
    )
    return set((await conn.execute(stmt)).scalars())


async def mark_failed(
    conn: AsyncConnection,
    event_id: str,
    claim_version: int,
    fence: Fence,
    *,
    error: str,
    next_retry_at: datetime,
) -> bool:
    """Record a transient failure and when to retry; False if the lease was lost."""
    stmt = (
        update(t)
        .where(t.c.id == event_id, t.c.claim_version == claim_version, _held(fence))
        .values(
            status=FAILED,
            last_error=truncate_error(error),
            next_retry_at=next_retry_at,
            **_RELEASE_LOCK,
        )
        .returning(t.c.id)
    )
    return (await conn.execute(stmt)).first() is not None


async def mark_dead_letter(
    conn: AsyncConnection,
    event_id: str,
    claim_version: int,
    fence: Fence,
    *,
    error: str,
    reason: str,
) -> bool:
    """Move an event to the dead letter; False if the lease was lost."""
    stmt = (
        update(t)
        .where(t.c.id == event_id, t.c.claim_version == claim_version, _held(fence))
        .values(
            status=DEAD_LETTER,
            last_error=truncate_error(error),
            dead_letter_reason=truncate_error(reason),
            next_retry_at=None,
            **_RELEASE_LOCK,
        )
        .returning(t.c.id)
    )
    return (await conn.execute(stmt)).first() is not None


async def release_unattempted(
    conn: AsyncConnection,
    claims: Iterable[tuple[str, int]],
    fence: Fence,
) -> set[str]:
    """Hand back claimed rows that were never attempted, without spending an attempt."""
    pairs = list(claims)
    if not pairs:
        return set()
    stmt = (
        update(t)
        .where(tuple_(t.c.id, t.c.claim_version).in_(pairs), _held(fence))
        .values(
            status=case((t.c.attempt_count <= 1, PENDING), else_=FAILED),
            attempt_count=case((t.c.attempt_count > 0, t.c.attempt_count - 1), else_=0),
            **_RELEASE_LOCK,
        )
        .returning(t.c.id)
    )
    return set((await conn.execute(stmt)).scalars())
