"""One transaction per unit of work, with domain events written before commit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from engine.context import TaskContext, _task_context
from engine.errors import DomainEventError, OutboxTransactionError
from engine.writing.domain import (
    AggregateRoot,
    event_payload,
    has_pending_events,
    tracked_aggregates,
)
from engine.writing.publisher import (
    SESSION_CONTEXT,
    SESSION_REGISTRY,
    OutboxEvent,
    OutboxEventPublisher,
)
from engine.writing.registry import EventRegistry


@dataclass(slots=True)
class _ActiveUnit:
    engine: AsyncEngine
    session: AsyncSession
    task: asyncio.Task[Any] | None
    open: bool = True
    failed: bool = False

    def joinable(self) -> bool:
        """Only the task that opened a unit may join it, and only while it is open.

        Context variables are copied into tasks created inside a unit; such a task
        must get a unit of its own, never share (or outlive) this session.
        """
        return self.open and self.task is _current_task()


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


_active_unit: ContextVar[_ActiveUnit | None] = ContextVar("outbox_unit_of_work", default=None)


@asynccontextmanager
async def unit_of_work(
    engine: AsyncEngine,
    *,
    registry: EventRegistry | None = None,
    context: TaskContext | None = None,
) -> AsyncIterator[AsyncSession]:
    """Yield one ``AsyncSession`` in one transaction: commit on success, roll back on error.

    A nested call on the same engine, in the same task, reuses the outer session
    and transaction; if the nested block raises, the outer transaction is rolled
    back even when the caller catches the error. A task started inside a unit of
    work gets its own unit when it opens one.
    Before committing, events recorded by aggregates in the session become
    outbox rows in the same transaction; their buffers are cleared only after
    the commit succeeds.
    """
    outer = _active_unit.get()
    if outer is not None and outer.joinable():
        if outer.engine is not engine and outer.engine.url != engine.url:
            raise OutboxTransactionError(
                "a nested unit_of_work must use the same database as the outer one"
            )
        try:
            yield outer.session
        except BaseException:
            outer.failed = True  # the whole transaction is doomed, even if the caller recovers
            raise
        return
    session = AsyncSession(engine, expire_on_commit=False)
    session.info[SESSION_REGISTRY] = registry
    session.info[SESSION_CONTEXT] = context
    unit = _ActiveUnit(engine, session, _current_task())
    unit_token = _active_unit.set(unit)
    context_token = _task_context.set(context) if context is not None else None
    try:
        async with session.begin():
            yield session
            if unit.failed:
                raise OutboxTransactionError(
                    "an inner unit_of_work failed, so the whole transaction was rolled back "
                    "(its writes and events are not committed)"
                )
            aggregates = await write_domain_events(session, registry, context)
        for aggregate in aggregates:
            aggregate.clear_domain_events()
    finally:
        unit.open = False
        if context_token is not None:
            _task_context.reset(context_token)
        _active_unit.reset(unit_token)
        await session.close()


async def write_domain_events(
    session: AsyncSession, registry: EventRegistry | None, context: TaskContext | None
) -> list[AggregateRoot]:
    """Write the events that aggregates in ``session`` recorded as outbox rows; returns
    those aggregates, whose buffers the caller clears once the transaction committed."""
    aggregates, drafts = await session.run_sync(domain_event_drafts, registry, context)
    if drafts:
        await OutboxEventPublisher(session, registry).publish_many(drafts)
    return aggregates


def domain_event_drafts(
    sync: Session, registry: EventRegistry | None, context: TaskContext | None
) -> tuple[list[AggregateRoot], list[OutboxEvent]]:
    """The aggregates in ``sync`` with recorded events, and those events as outbox events.

    Flushes first when there are any, so new aggregates have their primary keys. Shared
    by the async and the sync unit of work (engine.writing.sync_uow).
    """
    seen: dict[int, Any] = {}
    candidates = (*sync.new, *sync.identity_map.values(), *sync.deleted, *tracked_aggregates(sync))
    for obj in candidates:
        if has_pending_events(obj):
            seen[id(obj)] = obj
    aggregates: list[AggregateRoot] = list(seen.values())
    if not aggregates:
        return [], []
    if registry is None:
        raise DomainEventError(
            "aggregates recorded domain events but the unit_of_work has no EventRegistry"
        )
    if context is None:
        raise DomainEventError(
            "aggregates recorded domain events but the unit_of_work has no TaskContext "
            "(tenant, actor and request are required on every outbox event)"
        )
    sync.flush()  # primary keys for aggregates that are new in this unit
    drafts: list[OutboxEvent] = []
    for aggregate in aggregates:
        for event in aggregate.domain_events:
            mapping = registry.domain_event_mapping(type(event))
            if mapping is None:
                raise DomainEventError(
                    f"domain event {type(event).__qualname__} is not mapped: call "
                    "registry.map_domain_event(...) for it"
                )
            aggregate_id = (
                mapping.subject(event) if mapping.subject else _primary_key_text(aggregate)
            )
            drafts.append(
                OutboxEvent(
                    event_type=mapping.event_type,
                    payload=event_payload(event),
                    aggregate_type=mapping.aggregate_type,
                    aggregate_id=aggregate_id,
                    event_version=mapping.event_version,
                    tenant_id=context.tenant_id,
                )
            )
    return aggregates, drafts


def _primary_key_text(aggregate: Any) -> str:
    identity = sa_inspect(aggregate).identity
    if not identity:
        raise DomainEventError(
            f"{type(aggregate).__qualname__} has no primary key after flush; "
            "give the mapping a subject selector"
        )
    return ":".join(str(part) for part in identity)
