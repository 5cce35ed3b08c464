"""Pause and resume delivery per event type, for every tenant or for one.

A pause is a row in ``outbox_pauses``, so every dispatcher on every machine sees
it on its next claim: paused events are not claimed, so they stay pending (or
failed, waiting for their retry), spend no attempts and are never dead-lettered.
Events already in flight when the pause is made finish as usual.

Every pause and resume writes one ``outbox_pause_log`` row: who, why, when.
``claim_filter`` turns the active pauses into the shape the claim filters on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, exists, func, insert, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from engine.clock import utc_now
from engine.errors import ConfigurationError, PauseError
from engine.operating.replay import default_operator
from engine.storage.database import read_only_engine, storage_errors
from engine.storage.schema import (
    ALL_TENANTS,
    BACKLOG_PREDICATE,
    FAILED,
    PENDING,
    outbox_events,
    pause_log,
    pauses,
)

t = outbox_events
#: The statuses a pause holds back: what it counts as waiting.
WAITING_STATUSES = (PENDING, FAILED)
_TYPE_LIMIT, _TENANT_LIMIT = 200, 128  # the lengths of the columns


@dataclass(frozen=True, slots=True)
class Pause:
    """One active pause; ``tenant_id`` None pauses the type for every tenant."""

    event_type: str
    tenant_id: str | None
    reason: str
    paused_by: str
    paused_at: datetime

    def describe(self) -> str:
        return describe_scope(self.event_type, self.tenant_id)


def describe_scope(event_type: str, tenant_id: str | None) -> str:
    """``orders.placed (every tenant)`` or ``orders.placed (tenant acme)``."""
    scope = "every tenant" if tenant_id is None else f"tenant {tenant_id}"
    return f"{event_type} ({scope})"


@dataclass(frozen=True, slots=True)
class PausedBacklog:
    """A pause and how many events it holds back now (pending or failed)."""

    pause: Pause
    waiting: int


@dataclass(frozen=True, slots=True)
class PauseLogEntry:
    """One audited pause or resume."""

    action: str  # pause | resume
    event_type: str
    tenant_id: str | None
    operator: str
    reason: str | None
    at: datetime


@dataclass(frozen=True, slots=True)
class ClaimFilter:
    """What a claim must leave alone: whole event types, and (event type, tenant) pairs."""

    event_types: frozenset[str] = frozenset()
    pairs: frozenset[tuple[str, str]] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.event_types or self.pairs)

    def is_paused(self, event_type: str, tenant_id: str) -> bool:
        return event_type in self.event_types or (event_type, tenant_id) in self.pairs


def claim_filter(active: Iterable[Pause]) -> ClaimFilter:
    """The claim's filter for ``active`` pauses (pure).

    A tenant pause of a type that is also paused for every tenant is left out of
    ``pairs``: the type is excluded whole.
    """
    whole = frozenset(p.event_type for p in active if p.tenant_id is None)
    pairs = frozenset(
        (p.event_type, p.tenant_id)
        for p in active
        if p.tenant_id is not None and p.event_type not in whole
    )
    return ClaimFilter(whole, pairs)


def _scope(event_type: str, tenant_id: str | None) -> str:
    """The stored tenant_id for a pause scope, after checking both names."""
    if not event_type or not event_type.strip() or len(event_type) > _TYPE_LIMIT:
        raise ConfigurationError(
            f"the event type must be 1 to {_TYPE_LIMIT} characters, got {event_type!r}"
        )
    if tenant_id is None:
        return ALL_TENANTS
    if not tenant_id.strip() or len(tenant_id) > _TENANT_LIMIT:
        raise ConfigurationError(
            f"the tenant must be 1 to {_TENANT_LIMIT} characters (leave it out to pause "
            f"every tenant), got {tenant_id!r}"
        )
    return tenant_id


def _pause(row: Any) -> Pause:
    tenant = None if row.tenant_id == ALL_TENANTS else row.tenant_id
    return Pause(row.event_type, tenant, row.reason, row.paused_by, row.paused_at)


async def pause(
    engine: AsyncEngine,
    event_type: str,
    tenant_id: str | None = None,
    *,
    reason: str,
    operator: str | None = None,
    now: datetime | None = None,
) -> Pause:
    """Pause delivery of ``event_type`` (for ``tenant_id``, or every tenant), audited.

    A conditional insert: ``PauseError`` when this scope is paused already, naming
    who paused it and why. A reason is required: the next operator needs it.
    """
    stored_tenant = _scope(event_type, tenant_id)
    if not reason or not reason.strip():
        raise ConfigurationError("a pause needs a reason (who waits for what)")
    operator = operator or default_operator()
    now = now or utc_now()
    values = {
        "event_type": event_type,
        "tenant_id": stored_tenant,
        "reason": reason,
        "paused_by": operator,
        "paused_at": now,
    }
    async with storage_errors(engine.url), engine.begin() as conn:
        dialect_insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
        stmt = (
            dialect_insert(pauses)
            .values(**values)
            .on_conflict_do_nothing()
            .returning(pauses.c.event_type)
        )
        if (await conn.execute(stmt)).first() is None:
            existing = (
                await conn.execute(
                    select(pauses).where(
                        pauses.c.event_type == event_type, pauses.c.tenant_id == stored_tenant
                    )
                )
            ).one()
            held = _pause(existing)
            raise PauseError(
                f"{held.describe()} is already paused, since {held.paused_at:%Y-%m-%d %H:%M} "
                f"UTC by {held.paused_by}: {held.reason}"
            )
        await _audit(conn, "pause", event_type, tenant_id, operator, reason, now)
    return Pause(event_type, tenant_id, reason, operator, now)


async def resume(
    engine: AsyncEngine,
    event_type: str,
    tenant_id: str | None = None,
    *,
    reason: str | None = None,
    operator: str | None = None,
    now: datetime | None = None,
) -> Pause:
    """End the pause of exactly this scope, audited; the pause it ended.

    ``PauseError`` when this scope is not paused. Resuming one tenant does not
    end a pause of every tenant, nor the reverse.
    """
    stored_tenant = _scope(event_type, tenant_id)
    operator = operator or default_operator()
    now = now or utc_now()
    async with storage_errors(engine.url), engine.begin() as conn:
        stmt = (
            delete(pauses)
            .where(pauses.c.event_type == event_type, pauses.c.tenant_id == stored_tenant)
            .returning(*pauses.c)
        )
        ended = (await conn.execute(stmt)).first()
        if ended is None:
            raise PauseError(f"{describe_scope(event_type, tenant_id)} is not paused")
        await _audit(conn, "resume", event_type, tenant_id, operator, reason, now)
    return _pause(ended)


async def active_pauses(conn: AsyncConnection) -> list[Pause]:
    """Every active pause, oldest first (a claim reads them in its own transaction)."""
    return [_pause(row) for row in await conn.execute(_ACTIVE_PAUSES)]


# Built once: every claim (and every round with a batch claimed ahead) reads the pauses.
_ACTIVE_PAUSES = select(pauses).order_by(
    pauses.c.paused_at, pauses.c.event_type, pauses.c.tenant_id
)


async def paused_backlog(engine: AsyncEngine) -> list[PausedBacklog]:
    """Every active pause with the events it holds back now, oldest pause first.

    One count per pause inside ix_outbox_events_type_backlog (the predicate is
    repeated so SQLite matches the partial index).
    """
    async with storage_errors(engine.url), read_only_engine(engine).connect() as conn:
        found = []
        for held in await active_pauses(conn):
            stmt = waiting_count(held.event_type, held.tenant_id)
            found.append(PausedBacklog(held, int((await conn.execute(stmt)).scalar_one())))
    return found


async def waiting(engine: AsyncEngine, event_type: str, tenant_id: str | None = None) -> int:
    """How many events of a type (and tenant) wait now, pending or failed: what a pause
    of that scope would hold back (the count the pause dialog shows before pausing)."""
    stored = _scope(event_type, tenant_id)
    async with storage_errors(engine.url), read_only_engine(engine).connect() as conn:
        stmt = waiting_count(event_type, None if stored == ALL_TENANTS else stored)
        return int((await conn.execute(stmt)).scalar_one())


async def type_in_outbox(engine: AsyncEngine, event_type: str) -> bool:
    """Whether the outbox holds any event of ``event_type``, in any status: a type no
    one has published is likely a typo before a pause.

    No index leads with the type alone, so a type that is absent costs a scan; it runs
    once per ``pause`` from the command line, never on a dispatcher's path.
    """
    async with storage_errors(engine.url), read_only_engine(engine).connect() as conn:
        stmt = select(exists().where(t.c.event_type == event_type))
        return bool((await conn.execute(stmt)).scalar_one())


def waiting_count(event_type: str, tenant_id: str | None) -> Any:
    """The count of pending and failed events of a type (and tenant): index-backed."""
    stmt = (
        select(func.count())
        .select_from(t)
        .where(text(BACKLOG_PREDICATE), t.c.status.in_(WAITING_STATUSES))
        .where(t.c.event_type == event_type)
    )
    if tenant_id is not None:
        stmt = stmt.where(t.c.tenant_id == tenant_id)
    return stmt


async def pause_history(engine: AsyncEngine, *, limit: int = 50) -> list[PauseLogEntry]:
    """The latest pauses and resumes, newest first."""
    stmt = select(pause_log).order_by(pause_log.c.id.desc()).limit(limit)
    async with storage_errors(engine.url), read_only_engine(engine).connect() as conn:
        rows = (await conn.execute(stmt)).all()
    return [
        PauseLogEntry(r.action, r.event_type, r.tenant_id, r.operator, r.reason, r.at) for r in rows
    ]


async def _audit(
    conn: AsyncConnection,
    action: str,
    event_type: str,
    tenant_id: str | None,
    operator: str,
    reason: str | None,
    now: datetime,
) -> None:
    await conn.execute(
        insert(pause_log).values(
            action=action,
            event_type=event_type,
            tenant_id=tenant_id,
            operator=operator,
            reason=reason,
            at=now,
        )
    )
