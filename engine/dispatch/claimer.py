"""Claiming batches for one dispatcher, and remembering where its last claim got to.

The claimer's cursor says where the next claim starts, so consecutive claims walk on
instead of starting over:

- ``key`` / ``include_key``: where the walk over ordering keys goes on;
- ``seq_floor``: a keyset floor, where the unordered part goes on after a full batch
  (decision 0008). Rows below it that become due again are found when a claim from
  the floor finds nothing (it goes round from 0 at once), and at least every
  ``SEQ_FLOOR_RESET``;
- ``ranges``: the unordered part's plan (one index range per served type), reused by
  claims from the floor;
- ``ordered_first``: whether heads of keys or unordered rows fill the batch first; it
  alternates by claim.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.selectable import TextualSelect

from engine.dispatch import claim_sql
from engine.dispatch.claim_sql import ClaimShape
from engine.dispatch.claimed import ClaimedRow
from engine.storage import psycopg_paths
from engine.storage.drivers import as_dbapi_error, is_asyncpg, is_psycopg

# A claimer's keyset floor goes back to 0 at least this often, so rows below it that
# became due again wait at most this long.
SEQ_FLOOR_RESET = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class ClaimScope:
    """Which rows a dispatcher may claim: the event types it can deliver, minus pauses.

    ``types`` are the types this dispatcher serves (its handlers, or everything its
    relay can publish) with fully paused types already taken out; ``paused_pairs``
    are (event_type, tenant_id) pairs paused for one tenant. Rows outside the scope
    stay as they are, spending no attempt: another dispatcher may serve them, and a
    paused type waits for its resume. A key whose head is out of scope waits too.
    """

    types: frozenset[str]
    paused_pairs: frozenset[tuple[str, str]] = frozenset()

    def admits(self, event_type: str, tenant_id: str) -> bool:
        return event_type in self.types and (event_type, tenant_id) not in self.paused_pairs


@dataclass(frozen=True, slots=True)
class ClaimCursor:
    """Where the next claim starts (see the module docstring)."""

    key: str = ""
    include_key: bool = False
    seq_floor: int = 0
    ranges: tuple[str, ...] | None = None
    ordered_first: bool = True


@dataclass(frozen=True, slots=True)
class ClaimedBatch:
    """The rows one claim took, and the cursor the claimer goes on from."""

    rows: list[ClaimedRow]
    cursor: ClaimCursor


class Claimer:
    """Claims up to ``batch_size`` due rows at a time for ``dispatcher_id``, under a lease.

    A row whose lease expired is reclaimed alone, one per claim, ahead of waiting rows:
    if it is what killed the last dispatcher, it can only spend its own attempts, never
    those of a whole batch claimed with it. Ordered rows are heads of their keys only, at
    most one per key, and only while no other row of the key is in flight. A walk visits
    at most ``walk_limit`` keys (default: 4 x batch, at least 100), so many blocked keys
    cost bounded work per claim.
    """

    def __init__(
        self,
        dispatcher_id: str,
        batch_size: int,
        lease: timedelta,
        *,
        walk_limit: int | None = None,
        cursor: ClaimCursor | None = None,
    ) -> None:
        self.dispatcher_id = dispatcher_id
        self.batch_size = batch_size
        self.lease = lease
        self.walk_limit = walk_limit or max(4 * batch_size, 100)
        self.cursor = cursor or ClaimCursor()
        self._floor_since: datetime | None = None  # when the floor last was 0

    async def claim(
        self, conn: AsyncConnection, now: datetime, scope: ClaimScope | None = None
    ) -> ClaimedBatch:
        """Claim a batch in ``conn``'s transaction, from the claimer's cursor.

        ``scope`` (None: every row) limits the claim to the event types the dispatcher can
        deliver, less pauses; rows outside it are left untouched. Once the transaction
        has committed, ``committed(batch)`` moves the cursor on.
        """
        cursor = self.cursor
        if self._floor_since is not None and now - self._floor_since >= SEQ_FLOOR_RESET:
            cursor = replace(cursor, seq_floor=0)  # now and then from the first row
        if cursor.seq_floor == 0 or self._floor_since is None:
            self._floor_since = now
        batch = await self._claim_from(conn, now, scope, cursor)
        return ClaimedBatch(
            batch.rows, replace(batch.cursor, ordered_first=not cursor.ordered_first)
        )

    def committed(self, batch: ClaimedBatch) -> None:
        """``batch``'s claim committed: the next claim goes on from where it got to."""
        self.cursor = batch.cursor

    async def _claim_from(
        self, conn: AsyncConnection, now: datetime, scope: ClaimScope | None, cursor: ClaimCursor
    ) -> ClaimedBatch:
        dialect = conn.dialect.name
        if dialect == "postgresql":
            # Never JIT-compile a claim: it runs in milliseconds, compiling takes hundreds.
            await conn.execute(claim_sql.NO_JIT)
        if scope is not None and not scope.types:
            # Serves nothing now (all paused): claim nothing, and start from the first row.
            return ClaimedBatch([], ClaimCursor(cursor.key, ordered_first=cursor.ordered_first))
        common = {
            **(claim_sql.scope_params(dialect, scope) if scope is not None else {}),
            "now": now,
            "locked_until": now + self.lease,
            "dispatcher_id": self.dispatcher_id,
            "batch": self.batch_size,
            "walk_limit": self.walk_limit,
        }
        rows, ranges = await self._run(conn, common, scope, cursor)
        went_round_from = None  # the key cursor of a claim that found nothing after it
        if not rows and (cursor.key or cursor.seq_floor):
            # Nothing due after the cursor or the floor: go round from the first key and the
            # first row now, in the same transaction, rather than report an empty round.
            went_round_from = cursor.key or None
            cursor = replace(cursor, key="", include_key=False, seq_floor=0)
            rows, ranges = await self._run(conn, common, scope, cursor)
        rows.sort(key=lambda r: r.seq)
        next_cursor = await self._next_cursor(conn, rows, cursor, ranges, went_round_from)
        return ClaimedBatch(rows, next_cursor)

    async def _run(
        self,
        conn: AsyncConnection,
        common: Mapping[str, Any],
        scope: ClaimScope | None,
        cursor: ClaimCursor,
    ) -> tuple[list[ClaimedRow], tuple[str, ...] | None]:
        """One claim statement from ``cursor``; returns its rows and the plan it used.

        Only a claim from the first row plans the unordered part anew; one from a floor
        keeps the plan it was given. The plan is only a route: each range still filters
        by the scope, so a pause holds at once.
        """
        ranges = cursor.ranges
        if cursor.seq_floor == 0 or scope is None:
            planned = await _per_type_plan(conn, scope)
            ranges = None if planned is None else tuple(planned)
        shape = ClaimShape(
            cursor.ordered_first,
            scope is not None,
            None if ranges is None else len(ranges),
            cursor.include_key,
            scope is not None and bool(scope.paused_pairs),
        )
        dialect = conn.dialect.name
        stmt = claim_sql.claim_statement(dialect, shape)
        values = {
            **common,
            **{f"type_{i}": name for i, name in enumerate(ranges or ())},
            "key_cursor": cursor.key,
            "seq_floor": cursor.seq_floor,
        }
        records: Iterable[Any]
        if is_asyncpg(conn.dialect):
            records = await _fetch_on_driver(conn, stmt, values)
        elif is_psycopg(conn.dialect):
            records = await psycopg_paths.fetch_rows(conn, stmt, values)
        else:
            records = (await conn.execute(stmt, values)).mappings()
        # The row's own mapping (no copy per row): read-only, as ClaimedRow needs.
        return [ClaimedRow(values=row, raw_payload=row["payload"]) for row in records], ranges

    async def _next_cursor(
        self,
        conn: AsyncConnection,
        rows: list[ClaimedRow],
        cursor: ClaimCursor,
        ranges: tuple[str, ...] | None,
        went_round_from: str | None,
    ) -> ClaimCursor:
        """Where the claim after this one starts.

        A claim that went round from the first key and had to pass keys it could not
        take (in flight with other dispatchers, or blocked) starts the next walk at this
        batch's first key, the keys it is free to take, instead of walking the others'
        keys once more. Only for the claim right after: every key is still reached within
        a lap plus one batch.
        """
        full = len(rows) >= self.batch_size
        unordered = [r.seq for r in rows if r.ordering_key is None]
        # A full batch goes on after its last unordered row; one that is not full (nothing
        # more is due above the floor) starts from the first row next time.
        floor = (max(unordered) + 1 if unordered else cursor.seq_floor) if full else 0
        after = replace(cursor, seq_floor=floor, ranges=ranges, include_key=False)
        keys = [r.ordering_key for r in rows if r.ordering_key is not None]
        if keys and full:
            # Python's string order is the keys' order in the database (bytes of UTF-8:
            # COLLATE "C" on PostgreSQL, BINARY on SQLite). It only says where the next
            # walk starts, never which rows it may take.
            first, last = min(keys), max(keys)
            if went_round_from is not None:
                passed = {"after": max(went_round_from, last), "before": first}
                stmt = claim_sql.keys_passed_statement(conn.dialect.name)
                if (await conn.execute(stmt, passed)).scalar():
                    return replace(after, key=first, include_key=True)
            return replace(after, key=last)  # the batch filled up: go on after its last key
        if full and not cursor.ordered_first:
            # Unordered rows went first and filled the batch: the walk never ran, so it
            # starts where it would have this time.
            return replace(after, key=cursor.key, include_key=cursor.include_key)
        # The walk either reached the last key (start over next time) or stopped at its cap
        # among keys that are blocked or in flight (go on after the last key it saw).
        walk = {"key_cursor": cursor.key, "walk_limit": self.walk_limit}
        walk_end = claim_sql.walk_end_statement(conn.dialect.name, cursor.include_key)
        end = (await conn.execute(walk_end, walk)).first()
        capped = end is not None and int(end.n) >= self.walk_limit
        return replace(after, key=str(end.k) if capped and end is not None else "")


async def _per_type_plan(conn: AsyncConnection, scope: ClaimScope | None) -> list[str] | None:
    """The served types to read one by one, or None to walk the seq index.

    Ranges per type pay off only while rows of types outside the scope wait: then
    walking the seq index would step over all of them on every claim.
    """
    if scope is None:
        return None
    waiting_types = claim_sql.waiting_types_statement(conn.dialect.name)
    waiting = set((await conn.execute(waiting_types)).scalars())
    paused_waiting = {t for t, _tenant in scope.paused_pairs if t in waiting}
    if waiting <= scope.types and not paused_waiting:
        return None
    served = sorted(waiting & scope.types)
    return served if len(served) <= claim_sql.PER_TYPE_LIMIT else None


_DRIVER_SQL: dict[TextualSelect, tuple[str, tuple[str, ...]]] = {}


def _driver_sql(stmt: TextualSelect, dialect: Dialect) -> tuple[str, tuple[str, ...]]:
    """``stmt`` as asyncpg runs it: its SQL with ``$n`` parameters, and their names in order.

    Compiled once per statement (the claim statements are cached themselves).
    """
    found = _DRIVER_SQL.get(stmt)
    if found is None:
        compiled = stmt.compile(dialect=dialect)
        found = _DRIVER_SQL[stmt] = (compiled.string, tuple(compiled.positiontup or ()))
    return found


async def _fetch_on_driver(
    conn: AsyncConnection, stmt: TextualSelect, values: Mapping[str, Any]
) -> list[Any]:
    """Run the claim on the connection's asyncpg connection, in its transaction.

    asyncpg's records serve as the rows, skipping SQLAlchemy's per-row result processing
    (decision 0011). The transaction is SQLAlchemy's (begun by ``SET
    LOCAL jit``), errors are translated as ``execute`` would raise them, and the claim's
    parameters need no bind processing (aware UTC datetimes, text, integers, text arrays).
    """
    sql, names = _driver_sql(stmt, conn.dialect)
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    assert driver is not None and driver.is_in_transaction(), "the claim runs in a transaction"
    try:
        return list(await driver.fetch(sql, *(values[name] for name in names)))
    except Exception as exc:
        raise as_dbapi_error(conn.dialect, sql, exc) from exc
