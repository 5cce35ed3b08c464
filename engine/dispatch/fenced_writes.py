"""Every write that completes a claim: published, failed, dead letter, handed back.

Each one is a conditional update behind the fence: the row is still ``publishing``,
held by this dispatcher, with this claim's ``claim_version``, and its lease has not
expired. A write that matches nothing is a lost lease and changes nothing: another
dispatcher may have taken the row over. The fence is spelled once, in ``fence_sql``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Text, bindparam, case, column, select, text, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import TextClause

from engine.storage.payloads import truncate_error
from engine.storage.schema import (
    DEAD_LETTER,
    FAILED,
    PENDING,
    PUBLISHED,
    PUBLISHING,
    UtcDateTime,
    outbox_events,
)

t = outbox_events


@dataclass(frozen=True, slots=True)
class Fence:
    """Who completes, and when: a completion holds only if the lease is still this one's."""

    dispatcher_id: str
    now: datetime


def fence_sql(alias: str) -> str:
    """The fence on row ``alias``, with parameters ``:dispatcher_id`` and ``:now``.

    ``claim_version`` is matched with the row's id, by each statement. Wrapped in
    ``(...) IS TRUE``, the planner cannot use these terms to pick an index or guess row
    counts, so a fenced update always probes ids (decision 0012).
    """
    return (
        f"{alias}.locked_by = :dispatcher_id AND {alias}.status = '{PUBLISHING}' "
        f"AND {alias}.locked_until > :now"
    )


def _held(fence: Fence) -> TextClause:
    """The fence as a filter for the SQLAlchemy-built updates below."""
    return text(f"({fence_sql(t.name)}) IS TRUE").bindparams(
        bindparam("dispatcher_id", fence.dispatcher_id),
        bindparam("now", fence.now, type_=UtcDateTime()),
    )


_RELEASE_LOCK = {"locked_by": None, "locked_until": None}

# PostgreSQL: the claims travel as two strings (the ids, each after a separator none of
# them holds, and the versions joined by commas), so the text is the same for every batch
# and is prepared once; the published ids come back as one string (decision
# 0013). Each claim is looked up alone by primary key and locked, so a row
# that another dispatcher took over meanwhile is waited for and tested again in its new
# version (tests/engine/test_fencing.py).
_PUBLISH_PG = (
    text(
        f"""WITH published AS (
UPDATE outbox_events SET
    status = '{PUBLISHED}', published_at = :now, last_error = NULL, next_retry_at = NULL,
    locked_by = NULL, locked_until = NULL
WHERE ctid = ANY(ARRAY(
    SELECT held.ref
    FROM unnest(
        CAST((string_to_array(:ids, :separator))[2:] AS varchar[]),
        CAST(string_to_array(:versions, ',') AS integer[])
    ) AS c(id, claim_version)
    CROSS JOIN LATERAL (
        SELECT e.ctid AS ref FROM outbox_events AS e
        WHERE e.id = c.id AND e.claim_version = c.claim_version AND ({fence_sql("e")}) IS TRUE
        LIMIT 1 FOR UPDATE
    ) AS held
))
RETURNING id
)
SELECT string_agg(id, :separator) AS ids FROM published"""
    )
    .bindparams(bindparam("now", type_=UtcDateTime()))
    .columns(column("ids", Text))
)

# SQLite: the claims travel as one JSON array of [id, claim_version] pairs. The fence is
# spelled plainly here, so SQLite probes its (status, id) index for each pair
# (tests/engine/test_query_plans.py).
_PUBLISH_SQLITE = text(
    f"""UPDATE outbox_events SET
    status = '{PUBLISHED}', published_at = :now, last_error = NULL, next_retry_at = NULL,
    locked_by = NULL, locked_until = NULL
WHERE (id, claim_version) IN (
        SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:claims)
    )
    AND {fence_sql("outbox_events")}
RETURNING id"""
).bindparams(bindparam("now", type_=UtcDateTime()))


def joined_ids(ids: Sequence[str]) -> tuple[str, str]:
    """``ids`` as one string, each after a separator, and that separator: a character none
    of them holds.

    Each id follows a separator, so the SQL drops the split's empty first element and an
    empty id is kept (``string_to_array('', ...)`` is an empty array, not one empty id).
    The unit separator (U+001F) as good as always; else the first other control
    character, then code point past the surrogates, that no id holds.
    """
    joined = "\x1f".join(ids)
    if joined.count("\x1f") == len(ids) - 1:
        return "\x1f" + joined, "\x1f"
    used = set("".join(ids))
    candidates = itertools.chain(range(0x1E, 0, -1), range(0xE000, 0x110000))
    separator = next(chr(c) for c in candidates if chr(c) not in used)
    return separator + separator.join(ids), separator


async def mark_published(
    conn: AsyncConnection,
    claims: Sequence[tuple[str, int]],
    fence: Fence,
) -> set[str]:
    """Complete a batch as published; returns the ids whose lease still held."""
    if not claims:
        return set()
    if conn.dialect.name == "postgresql":
        ids, separator = joined_ids([event_id for event_id, _version in claims])
        params = {
            "now": fence.now,
            "dispatcher_id": fence.dispatcher_id,
            "ids": ids,
            "separator": separator,
            "versions": ",".join([str(version) for _event_id, version in claims]),
        }
        published = (await conn.execute(_PUBLISH_PG, params)).scalar()
        return set() if published is None else set(published.split(separator))
    if not any("\x00" in event_id for event_id, _version in claims):
        params = {
            "now": fence.now,
            "dispatcher_id": fence.dispatcher_id,
            "claims": json.dumps(claims),
        }
        return set((await conn.execute(_PUBLISH_SQLITE, params)).scalars())
    # SQLite's JSON functions end a string at NUL, which an id written with plain SQL may
    # hold: such a batch goes as bound pairs, compiled for this batch.
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


async def hold(conn: AsyncConnection, event_id: str, claim_version: int, fence: Fence) -> bool:
    """Whether the claim still holds; if so, its row stays locked until ``conn``'s
    transaction ends (PostgreSQL; SQLite's write lock already keeps every other writer
    out), so no other dispatcher can take the event over before that transaction commits.
    """
    stmt = (
        select(t.c.id)
        .where(t.c.id == event_id, t.c.claim_version == claim_version, _held(fence))
        .with_for_update()
    )
    return (await conn.execute(stmt)).first() is not None


async def mark_failed(
    conn: AsyncConnection,
    event_id: str,
    claim_version: int,
    fence: Fence,
    *,
    error: str,
    next_retry_at: datetime,
    refund_attempt: bool = False,
) -> bool:
    """Record a transient failure and when to retry; False if the lease was lost.

    ``refund_attempt``: the failure was not the event's (the broker was away), so the
    attempt this claim took is given back.
    """
    refund = {"attempt_count": t.c.attempt_count - 1} if refund_attempt else {}
    stmt = (
        update(t)
        .where(t.c.id == event_id, t.c.claim_version == claim_version, _held(fence))
        .values(
            status=FAILED,
            last_error=truncate_error(error),
            next_retry_at=next_retry_at,
            **refund,
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
    release_key: bool = False,
) -> bool:
    """Move an event to the dead letter; False if the lease was lost.

    A dead letter with an ordering key holds back the later events of its key until it
    is replayed or skipped; ``release_key`` skips it at once (the type's ``skip`` policy).
    """
    stmt = (
        update(t)
        .where(t.c.id == event_id, t.c.claim_version == claim_version, _held(fence))
        .values(
            status=DEAD_LETTER,
            last_error=truncate_error(error),
            dead_letter_reason=truncate_error(reason),
            next_retry_at=None,
            skipped_at=fence.now if release_key else None,
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


async def completions_landed(
    conn: AsyncConnection, claims: Sequence[tuple[str, int]]
) -> dict[str, str]:
    """The status of each claim whose completion was committed, though its writer saw an error.

    A commit whose acknowledgement is lost (the server restarted, the connection was
    cut) may have landed. A completion clears the lease and keeps ``claim_version``; a
    later claim raises it. So a row that still has the claim's version and a completed
    status was completed by that claim's writer, and by no one else.
    """
    versions = dict(claims)
    if not versions:
        return {}
    stmt = select(t.c.id, t.c.claim_version, t.c.status).where(
        t.c.id.in_(list(versions)), t.c.status.in_([PUBLISHED, FAILED, DEAD_LETTER])
    )
    rows = (await conn.execute(stmt)).all()
    return {
        str(event_id): str(status)
        for event_id, version, status in rows
        if versions.get(str(event_id)) == version
    }
