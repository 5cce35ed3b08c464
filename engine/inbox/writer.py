"""The inbox's batch writer: many messages in one transaction, duplicates refused by index.

One statement per batch inserts every row and returns the ids it inserted. A row whose
CloudEvents (source, id) is already in ``outbox_events`` conflicts with
``uq_outbox_events_inbound`` and is skipped by ``ON CONFLICT ... DO NOTHING``: no read
before the write, so two consumers inserting one event at once leave one row (the second
waits for the first's transaction and skips it once that commits). A second copy within
one batch is left out before the statement, keeping the first.

- PostgreSQL (asyncpg or psycopg): ``INSERT ... SELECT`` over ``unnest`` of one array per
  column, in the batch's order (``WITH ORDINALITY``), so ``seq`` follows the order the
  broker delivered the messages in: one round trip whatever the batch's size.
- SQLite: one ``INSERT ... VALUES`` with a row of parameters per message, inside
  ``BEGIN IMMEDIATE`` (the engine's writers).

Two writers inserting the same identities in different orders (two consumers given the
same redelivered messages) can deadlock on the index's entries: PostgreSQL then aborts one
transaction, which is tried again after a random moment (``DEADLOCK_RETRIES`` times), as
nothing of it was kept. The caller acks the batch only once ``write`` returned: its commit is done.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, Integer, LargeBinary, Text, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.elements import TextClause
from sqlalchemy.types import TypeEngine

from engine.clock import as_utc
from engine.inbox.rows import COLUMNS, InboundRow
from engine.storage.schema import INBOUND_PREDICATE, outbox_events

# Each column's array type in PostgreSQL's unnest, and the cast back to the column's type.
_PG_ARRAY = {
    "event_version": "integer[]",
    "inbound_body": "bytea[]",
    "created_at": "timestamptz[]",
}
_PG_CAST = {"payload": "::jsonb", "inbound_attributes": "::jsonb"}
_PG_ELEMENT: dict[str, TypeEngine[Any]] = {
    "event_version": Integer(),
    "inbound_body": LargeBinary(),
    "created_at": DateTime(timezone=True),
}
_CONFLICT = f"ON CONFLICT (inbound_source, inbound_id) WHERE {INBOUND_PREDICATE} DO NOTHING"
_SQLITE_TIME = "%Y-%m-%d %H:%M:%S.%f"  # engine.storage.schema.UtcDateTime's text form
_CREATED = COLUMNS.index("created_at")
# PostgreSQL's deadlock_detected and serialization_failure: the transaction was rolled back
# whole, and the same statement may succeed at once.
_TRY_AGAIN = ("40P01", "40001")
DEADLOCK_RETRIES = 10


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a batch's transaction committed: the rows it inserted, and how many it left
    out as duplicates (their (source, id) was stored already, or earlier in the batch)."""

    stored: list[InboundRow] = field(default_factory=list)
    duplicates: int = 0


class InboxWriter:
    """Inserts batches of inbound rows into ``engine``'s ``outbox_events``."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name

    async def write(self, rows: Sequence[InboundRow]) -> WriteResult:
        """Insert ``rows`` in one transaction; returns once it committed.

        Raises what the driver raises (the consumer treats it as a storage error and
        tries the same batch again, unacked).
        """
        unique = _first_of_each(rows)
        if not unique:
            return WriteResult([], len(rows))
        for attempt in range(DEADLOCK_RETRIES + 1):
            try:
                inserted = await self._insert(unique)
            except DBAPIError as exc:
                if attempt == DEADLOCK_RETRIES or _sqlstate(exc) not in _TRY_AGAIN:
                    raise
                # A moment's random pause, so the two do not meet in the same order again.
                await asyncio.sleep(random.uniform(0, 0.01 * (attempt + 1)))
                continue
            break
        stored = [row for row in unique if row.event_id in inserted]
        return WriteResult(stored, len(rows) - len(stored))

    async def _insert(self, rows: list[InboundRow]) -> set[str]:
        async with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                columns = zip(*(row.values for row in rows), strict=True)
                arrays = {f"c{n}": list(values) for n, values in enumerate(columns)}
                result = await conn.execute(_postgresql_insert(), arrays)
            else:
                params = tuple(value for row in rows for value in _sqlite_values(row))
                result = await conn.exec_driver_sql(_sqlite_insert(len(rows)), params)
            return {row[0] for row in result.all()}


def _sqlstate(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlstate", None)


def _first_of_each(rows: Sequence[InboundRow]) -> list[InboundRow]:
    """``rows`` less any whose identity an earlier row of the batch has."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for row in rows:
        if row.identity is not None:
            if row.identity in seen:
                continue
            seen.add(row.identity)
        kept.append(row)
    return kept


def _sqlite_values(row: InboundRow) -> tuple[object, ...]:
    values = list(row.values)
    created = values[_CREATED]
    if isinstance(created, datetime):
        values[_CREATED] = as_utc(created).strftime(_SQLITE_TIME)
    return tuple(values)


@functools.cache
def _postgresql_insert() -> TextClause:
    """One array parameter per column (``:c0`` ...), typed, so every driver (asyncpg,
    psycopg) sends each as an array of its column's type."""
    names = ", ".join(COLUMNS)
    arrays = ", ".join(
        f"CAST(:c{n} AS {_PG_ARRAY.get(column, 'text[]')})" for n, column in enumerate(COLUMNS)
    )
    picked = ", ".join(f"u.{column}{_PG_CAST.get(column, '')}" for column in COLUMNS)
    sql = (
        f"INSERT INTO {outbox_events.name} ({names}) "
        f"SELECT {picked} FROM unnest({arrays}) WITH ORDINALITY AS u({names}, n) "
        f"ORDER BY u.n {_CONFLICT} RETURNING id"
    )
    return text(sql).bindparams(
        *(
            bindparam(f"c{n}", type_=ARRAY(_PG_ELEMENT.get(column, Text())))
            for n, column in enumerate(COLUMNS)
        )
    )


@functools.cache
def _sqlite_insert(rows: int) -> str:
    names = ", ".join(COLUMNS)
    one = "(" + ", ".join("?" for _ in COLUMNS) + ")"
    return (
        f"INSERT INTO {outbox_events.name} ({names}) VALUES {', '.join([one] * rows)} "
        f"{_CONFLICT} RETURNING id"
    )
