"""Durable memory of what handlers and their side effects already did.

At-least-once delivery means a handler can see the same event again (a retry,
a reclaimed lease, a replay). Handler runs are keyed by event id + handler key
so a handler that succeeded is skipped; side effects are keyed by tenant,
actor, event, handler and effect key so a succeeded call to an external
system is answered from its recorded response instead of being made again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import Insert

from engine.clock import Clock, utc_now
from engine.handlers.record_writer import RecordWriter
from engine.storage.database import read_only_engine
from engine.storage.payloads import truncate_error
from engine.storage.schema import handler_runs, side_effects

SUCCEEDED = "succeeded"
FAILED = "failed"


@dataclass(slots=True)  # not frozen: one per handler call (see decision 0025)
class HandlerRunRecord:
    event_id: str
    handler_key: str
    succeeded: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class SideEffectKey:
    tenant_id: str
    actor_id: str
    event_id: str
    handler_key: str
    effect_key: str


@dataclass(frozen=True, slots=True)
class SideEffectRecord:
    status: str
    response: Any
    last_error: str | None


def _insert_for(conn: AsyncConnection) -> Any:
    return postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert


class IdempotencyStore:
    """Handler run and side-effect records, stored next to the outbox."""

    def __init__(self, engine: AsyncEngine, *, clock: Clock = utc_now) -> None:
        self._engine = engine
        self._clock = clock
        self._side_effects = RecordWriter(engine, side_effect_upsert, SIDE_EFFECT_COLUMNS)

    # -- handler runs -------------------------------------------------------
    async def succeeded_handlers(
        self, conn: AsyncConnection, event_ids: Sequence[str]
    ) -> set[tuple[str, str]]:
        """(event_id, handler_key) pairs that already succeeded, for a whole batch at once."""
        if not event_ids:
            return set()
        rows = await conn.execute(
            select(handler_runs.c.event_id, handler_runs.c.handler_key).where(
                handler_runs.c.event_id.in_(list(event_ids)),
                handler_runs.c.status == SUCCEEDED,
            )
        )
        return {(r[0], r[1]) for r in rows}

    async def record_handler_runs(
        self, conn: AsyncConnection, records: Iterable[HandlerRunRecord]
    ) -> None:
        """Upsert run records; a success is never downgraded to a failure."""
        now = self._clock()
        values = [
            {
                "event_id": r.event_id,
                "handler_key": r.handler_key,
                "status": SUCCEEDED if r.succeeded else FAILED,
                "last_error": None if r.error is None else truncate_error(r.error),
                "attempt_count": 1,
                "created_at": now,
                "updated_at": now,
            }
            for r in records
        ]
        if not values:
            return
        insert = _insert_for(conn)(handler_runs)
        stmt = insert.on_conflict_do_update(
            index_elements=[handler_runs.c.event_id, handler_runs.c.handler_key],
            set_={
                "status": insert.excluded.status,
                "last_error": insert.excluded.last_error,
                "attempt_count": handler_runs.c.attempt_count + 1,
                "updated_at": insert.excluded.updated_at,
            },
            where=handler_runs.c.status != SUCCEEDED,
        )
        await conn.execute(stmt, values)

    # -- side effects -------------------------------------------------------
    async def find_side_effect(self, key: SideEffectKey) -> SideEffectRecord | None:
        async with read_only_engine(self._engine).connect() as conn:
            row = (
                await conn.execute(
                    select(
                        side_effects.c.status, side_effects.c.response, side_effects.c.last_error
                    ).where(_effect_where(key))
                )
            ).first()
        return None if row is None else SideEffectRecord(row[0], row[1], row[2])

    async def record_side_effect(
        self,
        key: SideEffectKey,
        *,
        succeeded: bool,
        request: Any = None,
        response: Any = None,
        error: str | None = None,
    ) -> None:
        """Record an effect's outcome and return once it is committed."""
        await self.submit_side_effect(
            key, succeeded=succeeded, request=request, response=response, error=error
        )

    def submit_side_effect(
        self,
        key: SideEffectKey,
        *,
        succeeded: bool,
        request: Any = None,
        response: Any = None,
        error: str | None = None,
    ) -> asyncio.Future[None]:
        """Queue an effect's outcome for its commit, apart from the handler's own work so
        it outlives a failing handler, and group-committed with the other handlers'
        records (``RecordWriter``); the future is done once it is committed."""
        now: datetime = self._clock()
        return self._side_effects.submit(
            {
                "tenant_id": key.tenant_id,
                "actor_id": key.actor_id,
                "event_id": key.event_id,
                "handler_key": key.handler_key,
                "effect_key": key.effect_key,
                "status": SUCCEEDED if succeeded else FAILED,
                "request": request,
                "response": response,
                "last_error": None if error is None else truncate_error(error),
                "attempt_count": 1,
                "created_at": now,
                "updated_at": now,
            }
        )


SIDE_EFFECT_COLUMNS = (
    "tenant_id",
    "actor_id",
    "event_id",
    "handler_key",
    "effect_key",
    "status",
    "request",
    "response",
    "last_error",
    "attempt_count",
    "created_at",
    "updated_at",
)


def side_effect_upsert(dialect: Dialect) -> Insert:
    """Insert a side-effect record, or update an earlier failure of the same key (a success
    is never written over)."""
    insert: Insert = (postgresql.insert if dialect.name == "postgresql" else sqlite.insert)(
        side_effects
    )
    excluded = insert.excluded  # type: ignore[attr-defined]
    return insert.on_conflict_do_update(  # type: ignore[attr-defined,no-any-return]
        index_elements=[
            side_effects.c.tenant_id,
            side_effects.c.actor_id,
            side_effects.c.event_id,
            side_effects.c.handler_key,
            side_effects.c.effect_key,
        ],
        set_={
            "status": excluded.status,
            "request": excluded.request,
            "response": excluded.response,
            "last_error": excluded.last_error,
            "attempt_count": side_effects.c.attempt_count + 1,
            "updated_at": excluded.updated_at,
        },
        where=side_effects.c.status != SUCCEEDED,
    )


def _effect_where(key: SideEffectKey) -> Any:
    return and_(
        side_effects.c.tenant_id == key.tenant_id,
        side_effects.c.actor_id == key.actor_id,
        side_effects.c.event_id == key.event_id,
        side_effects.c.handler_key == key.handler_key,
        side_effects.c.effect_key == key.effect_key,
    )
