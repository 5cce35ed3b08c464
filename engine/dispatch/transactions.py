"""One transaction per transactional handler call, committed only while the claim holds.

The handler's writes, the events it publishes, the fence check and its run record (or,
when it is the event's only handler, the event's completion) share one transaction: if
the claim no longer holds, or the handler raises or runs past its timeout, all of it
rolls back.
"""

from __future__ import annotations

import asyncio
from enum import Enum
from typing import cast

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from engine.clock import Clock
from engine.dispatch import fenced_writes
from engine.dispatch.claimed import ClaimedRow
from engine.dispatch.handler_timeouts import HandlerTimeouts
from engine.handlers.idempotency import HandlerRunRecord, IdempotencyStore
from engine.handlers.transactional import HandlerSession, TransactionalHandler
from engine.writing.envelope import EventEnvelope
from engine.writing.publisher import SESSION_CONTEXT, SESSION_REGISTRY
from engine.writing.registry import EventRegistry, RegisteredHandler
from engine.writing.uow import write_domain_events


class Committed(Enum):
    """What a transactional call committed."""

    RUN = "run"  # the handler's writes and its run record
    EVENT = "event"  # the handler's writes and the event's completion (its only handler)
    NOTHING = "nothing"  # the claim no longer held: everything rolled back


class HandlerTransactions:
    """Runs transactional handlers on ``engine``, the outbox's own database."""

    def __init__(
        self,
        engine: AsyncEngine,
        registry: EventRegistry,
        idempotency: IdempotencyStore,
        *,
        dispatcher_id: str,
        clock: Clock,
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.idempotency = idempotency
        self.dispatcher_id = dispatcher_id
        self.clock = clock
        # SQLite has one writer, and each transaction here holds it for its handler's
        # whole call: one at a time per process, so a dispatcher's handlers queue here
        # instead of each polling for the write lock beside the producers.
        self._one_writer = asyncio.Lock() if engine.dialect.name == "sqlite" else None

    async def run(
        self,
        registered: RegisteredHandler,
        envelope: EventEnvelope,
        row: ClaimedRow,
        timeouts: HandlerTimeouts,
        worker: asyncio.Task[None] | None,
        *,
        completes_event: bool,
    ) -> Committed:
        """Call the handler in a transaction of its own and commit it behind the fence.

        Waiting for a connection (and, on SQLite, for the write lock) counts against the
        handler's timeout, as the call does. ``completes_event``: the handler is the
        event's only one, so its transaction also marks the event published.
        """
        conn = self.engine.connect()
        session: HandlerSession | None = None
        writing = False  # holds this process's turn at SQLite's write lock

        async def call() -> None:
            nonlocal session, writing
            if self._one_writer is not None:
                await self._one_writer.acquire()
                writing = True
            await conn.start()
            await conn.begin()
            session = HandlerSession(bind=conn, expire_on_commit=False)
            session.info[SESSION_REGISTRY] = self.registry
            session.info[SESSION_CONTEXT] = envelope.task_context()
            await session.begin()  # joins the connection's transaction: publishing may come first
            await self._call(session, registered, envelope)

        try:
            await timeouts.run(call(), worker)
            committed = await self._record(conn, registered, envelope, row, completes_event)
            if committed is Committed.NOTHING:
                await conn.rollback()
            else:
                await conn.commit()
            return committed
        finally:
            try:
                if session is not None:
                    await session.release()
            finally:
                try:
                    if conn.sync_connection is not None:  # it connected
                        await conn.close()  # a rollback, unless committed just above
                finally:
                    if writing:
                        assert self._one_writer is not None
                        self._one_writer.release()

    async def _call(
        self, session: HandlerSession, registered: RegisteredHandler, envelope: EventEnvelope
    ) -> None:
        handler = cast(TransactionalHandler, registered.handler)
        await handler(envelope, session)
        await session.flush()
        aggregates = await write_domain_events(session, self.registry, envelope.task_context())
        for aggregate in aggregates:  # their events are rows of this transaction now
            aggregate.clear_domain_events()

    async def _record(
        self,
        conn: AsyncConnection,
        registered: RegisteredHandler,
        envelope: EventEnvelope,
        row: ClaimedRow,
        completes_event: bool,
    ) -> Committed:
        fence = fenced_writes.Fence(self.dispatcher_id, self.clock())
        claim = (row.event_id, row.claim_version)
        if completes_event:
            done = await fenced_writes.mark_published(conn, [claim], fence)
            return Committed.EVENT if done else Committed.NOTHING
        if not await fenced_writes.hold(conn, *claim, fence):
            return Committed.NOTHING
        run = HandlerRunRecord(envelope.event_id, registered.key, True)
        await self.idempotency.record_handler_runs(conn, [run])
        return Committed.RUN
