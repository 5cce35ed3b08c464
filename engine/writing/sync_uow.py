"""One synchronous transaction per unit of work, with domain events written before commit.

The sync twin of ``unit_of_work`` (engine.writing.uow), for code on a sync ``Engine``:
the same nesting rule (a nested unit in the same thread reuses the outer session, and if it
raises the whole transaction rolls back), the same domain events, the same checks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from engine.context import TaskContext, _task_context
from engine.errors import OutboxTransactionError
from engine.writing.publisher import SESSION_CONTEXT, SESSION_REGISTRY
from engine.writing.registry import EventRegistry
from engine.writing.sync_publisher import SyncOutboxEventPublisher
from engine.writing.uow import domain_event_drafts


@dataclass(slots=True)
class _ActiveSyncUnit:
    engine: Engine
    session: Session
    thread: int
    open: bool = True
    failed: bool = False

    def joinable(self) -> bool:
        """Only the thread that opened a unit may join it, and only while it is open."""
        return self.open and self.thread == threading.get_ident()


_active_sync_unit: ContextVar[_ActiveSyncUnit | None] = ContextVar(
    "outbox_sync_unit_of_work", default=None
)


@contextmanager
def sync_unit_of_work(
    engine: Engine,
    *,
    registry: EventRegistry | None = None,
    context: TaskContext | None = None,
) -> Iterator[Session]:
    """Yield one ``Session`` in one transaction: commit on success, roll back on error.

    Before committing, events recorded by aggregates in the session become outbox rows in
    the same transaction; their buffers are cleared only after the commit succeeds.
    ``SyncOutboxEventPublisher(session)`` publishes with this unit's registry and context.
    """
    outer = _active_sync_unit.get()
    if outer is not None and outer.joinable():
        if outer.engine is not engine and outer.engine.url != engine.url:
            raise OutboxTransactionError(
                "a nested sync_unit_of_work must use the same database as the outer one"
            )
        try:
            yield outer.session
        except BaseException:
            outer.failed = True  # the whole transaction is doomed, even if the caller recovers
            raise
        return
    session = Session(engine, expire_on_commit=False)
    session.info[SESSION_REGISTRY] = registry
    session.info[SESSION_CONTEXT] = context
    unit = _ActiveSyncUnit(engine, session, threading.get_ident())
    unit_token = _active_sync_unit.set(unit)
    context_token = _task_context.set(context) if context is not None else None
    try:
        with session.begin():
            yield session
            if unit.failed:
                raise OutboxTransactionError(
                    "an inner sync_unit_of_work failed, so the whole transaction was rolled "
                    "back (its writes and events are not committed)"
                )
            aggregates, drafts = domain_event_drafts(session, registry, context)
            if drafts:
                SyncOutboxEventPublisher(session, registry).publish_many(drafts)
        for aggregate in aggregates:
            aggregate.clear_domain_events()
    finally:
        unit.open = False
        if context_token is not None:
            _task_context.reset(context_token)
        _active_sync_unit.reset(unit_token)
        session.close()
