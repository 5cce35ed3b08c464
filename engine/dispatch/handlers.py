"""Running one event's handlers, in order, each within the handler timeout.

A handler that succeeded on an earlier delivery is skipped (its run record says so).
No handler starts past the round's start budget, so none can run past the lease while
another dispatcher takes the event over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy.ext.asyncio import AsyncEngine

from engine.clock import Clock
from engine.context import _handler_invocation, _task_context
from engine.dispatch.claimed import ClaimedRow, Outcome
from engine.dispatch.handler_timeouts import HandlerTimedOut, HandlerTimeouts
from engine.dispatch.probe import DeliveryObserver, Probe, RunEvent
from engine.dispatch.transactions import Committed, HandlerTransactions
from engine.errors import EventHandlerPermanentError
from engine.handlers.idempotency import HandlerRunRecord, IdempotencyStore
from engine.tracing.spans import record_current_failure
from engine.tracing.tracer import active_tracer
from engine.writing.envelope import EventEnvelope
from engine.writing.registry import EventRegistry, Handler, RegisteredHandler

log = logging.getLogger("engine.dispatcher")


def runs_until(
    event_id: str,
    handlers: Sequence[RegisteredHandler],
    failed_key: str,
    error: str | None,
) -> list[HandlerRunRecord]:
    """The run records of a delivery that stopped at ``failed_key``: a success for each
    handler before it (one skipped as done before is already recorded so, and a success
    is never written over) and its failure, unless it never started (``error`` None)."""
    runs = []
    for registered in handlers:
        if registered.key == failed_key:
            if error is not None:
                runs.append(HandlerRunRecord(event_id, failed_key, False, error))
            break
        runs.append(HandlerRunRecord(event_id, registered.key, True))
    return runs


class HandlerRunner:
    """Runs the handlers ``registry`` has for an event. It records nothing itself, but
    for transactional handlers, whose ``transactions`` commit their own records.

    ``start_budget`` and ``lease`` only word the error of a handler that did not start.
    ``observers`` are told about each delivery (engine.dispatch.probe).
    """

    def __init__(
        self,
        registry: EventRegistry,
        idempotency: IdempotencyStore,
        reader: AsyncEngine,
        transactions: HandlerTransactions,
        *,
        clock: Clock,
        handler_timeout: float,
        start_budget: timedelta,
        lease: timedelta,
        observers: Sequence[DeliveryObserver] = (),
    ) -> None:
        self.registry = registry
        self.idempotency = idempotency
        self._reader = reader
        self.transactions = transactions
        self.clock = clock
        self.handler_timeout = handler_timeout
        self.start_budget = start_budget
        self.lease = lease
        self.observers = observers

    def for_round(self) -> RunEvent:
        """What a round's workers call for each event: ``run`` itself when nothing watches
        deliveries (no tracer configured, no observer), else ``run`` inside its span."""
        tracer = active_tracer()
        if tracer is None and not self.observers:
            return self.run
        return Probe(tracer, self.observers, self.clock).wrap(self.run)

    async def succeeded(self, envelopes: Iterable[EventEnvelope]) -> set[tuple[str, str]]:
        """(event id, handler key) of the runs that already succeeded, looked up only for
        events delivered before: a first attempt of a never-replayed event has none (a
        crash after a handler ran shows up as a later attempt), so it costs no query."""
        seen_before = [e.event_id for e in envelopes if e.attempt_count > 1 or e.replay_count]
        if not seen_before:
            return set()
        async with self._reader.connect() as conn:
            return await self.idempotency.succeeded_handlers(conn, seen_before)

    async def run(
        self,
        row: ClaimedRow,
        envelope: EventEnvelope,
        done: set[tuple[str, str]],
        timeouts: HandlerTimeouts,
        worker: asyncio.Task[None] | None,
        deadline: datetime,
    ) -> Outcome:
        """Run the event's handlers one after another; the first was started before
        ``deadline``, and each later one starts only if it is not past yet either. An event
        whose handlers need longer fails (a retry skips the ones that succeeded)."""
        event_id = envelope.event_id
        handlers = self.registry.handlers_for(envelope.event_type)
        context_token = _task_context.set(envelope)  # its TaskContext, when asked for
        started = False
        try:
            for registered in handlers:
                if done and (event_id, registered.key) in done:
                    continue  # already succeeded on an earlier delivery
                if started and self.clock() >= deadline:
                    error = (
                        f"{registered.key}: not started: the handlers before it spent the "
                        f"start budget ({self.start_budget.total_seconds():g} s of the "
                        f"{self.lease.total_seconds():g} s lease)"
                    )
                    runs = runs_until(event_id, handlers, registered.key, None)
                    return Outcome(row, "failed", error, None, runs)
                started = True
                handler_token = _handler_invocation.set(
                    (envelope, registered.key, self.idempotency)
                )
                try:
                    if not registered.transactional:
                        await timeouts.run(cast(Handler, registered.handler)(envelope), worker)
                    else:
                        committed = await self.transactions.run(
                            registered,
                            envelope,
                            row,
                            timeouts,
                            worker,
                            completes_event=len(handlers) == 1,
                        )
                        if committed is Committed.EVENT:
                            return Outcome(row, "completed", ran=handlers)
                        if committed is Committed.NOTHING:
                            return Outcome(row, "lost")
                except EventHandlerPermanentError as exc:
                    record_current_failure(exc)
                    error = f"permanent: {registered.key}: {exc}"
                    runs = runs_until(event_id, handlers, registered.key, error)
                    return Outcome(row, "dead_letter", error, error, runs)
                except Exception as exc:
                    record_current_failure(exc)
                    if isinstance(exc, HandlerTimedOut):
                        error = f"{registered.key}: timed out after {self.handler_timeout:g} s"
                    else:
                        error = f"{registered.key}: {type(exc).__name__}: {exc}"
                    log.debug("handler failed for event %s: %s", event_id, error)
                    runs = runs_until(event_id, handlers, registered.key, error)
                    return Outcome(row, "failed", error, None, runs)
                finally:
                    _handler_invocation.reset(handler_token)
        finally:
            _task_context.reset(context_token)
        return Outcome(row, "published", ran=handlers)
