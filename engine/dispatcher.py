"""Claim due events, deliver them, and record each outcome under the lease.

One round (``dispatch_once``) is three steps with no session per event:

1. claim a batch in one statement (see ``engine.store``);
2. deliver each event: to the registered handlers, or to an external
   publisher such as the RabbitMQ relay;
3. write every outcome in one transaction: the batch's successes in one update,
   failures and dead letters one by one, and the handler run records of every
   event that did not reach published (the ones that can be delivered again). Each is
   fenced by the claim's token, so a dispatcher whose lease expired (and whose
   rows another dispatcher has since reclaimed) changes nothing.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncEngine

from engine import store
from engine.backoff import BackoffPolicy
from engine.clock import Clock, utc_now
from engine.context import HandlerInvocation, _handler_invocation, _task_context
from engine.database import read_only_engine
from engine.envelope import EventEnvelope
from engine.errors import ConfigurationError, EventHandlerPermanentError, EventValidationError
from engine.idempotency import HandlerRunRecord, IdempotencyStore
from engine.registry import EventRegistry
from engine.store import ClaimedRow

log = logging.getLogger("engine.dispatcher")

# Share of the lease a batch may use for starting handlers; the rest is margin for the
# last handler and the completion write.
LEASE_BUDGET = 0.8


@dataclass(frozen=True, slots=True)
class DispatchResult:
    """What one round did. ``lost_leases`` counts completions the fence refused."""

    claimed: int = 0
    published: int = 0
    failed: int = 0
    dead_lettered: int = 0
    lost_leases: int = 0

    def __add__(self, other: DispatchResult) -> DispatchResult:
        return DispatchResult(
            self.claimed + other.claimed,
            self.published + other.published,
            self.failed + other.failed,
            self.dead_lettered + other.dead_lettered,
            self.lost_leases + other.lost_leases,
        )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(slots=True)
class ExternalPublishResult:
    """What an external publisher did with the envelopes it was given.

    ``failed`` maps event ids to an error (retried with backoff); ids in
    ``unattempted`` were not sent at all (the round stopped, for example the
    broker went away) and go back without spending an attempt. Any id in none
    of the three sets is treated as failed.
    """

    published: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    unattempted: set[str] = field(default_factory=set)


class ExternalPublisher(Protocol):
    """Delivers events somewhere else (a broker) instead of calling local handlers."""

    async def publish(self, envelopes: Sequence[EventEnvelope]) -> ExternalPublishResult: ...


class LockProvider(Protocol):
    """A coarse cross-process lock taken around each claim round (optional)."""

    async def acquire(self) -> bool: ...

    async def release(self) -> None: ...


class DispatchObserver(Protocol):
    """Told about every round (metrics)."""

    async def observe_round(self, result: DispatchResult) -> None: ...


@dataclass(frozen=True, slots=True)
class _Outcome:
    row: ClaimedRow
    kind: str  # "published" | "failed" | "dead_letter" | "unattempted"
    error: str | None = None
    reason: str | None = None


def default_dispatcher_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class OutboxDispatcher:
    """Moves outbox events from pending to published, failed or dead letter."""

    def __init__(
        self,
        engine: AsyncEngine,
        registry: EventRegistry,
        *,
        dispatcher_id: str | None = None,
        batch_size: int = 100,
        lease_seconds: float = 30.0,
        max_attempts: int | None = None,
        backoff: BackoffPolicy | None = None,
        idempotency_store: IdempotencyStore | None = None,
        external_publisher: ExternalPublisher | None = None,
        lock_provider: LockProvider | None = None,
        observers: Sequence[DispatchObserver] = (),
        clock: Clock = utc_now,
    ) -> None:
        if not 1 <= batch_size <= 10_000:
            raise ConfigurationError(f"batch_size must be between 1 and 10000, got {batch_size}")
        if lease_seconds <= 0:
            raise ConfigurationError(f"lease_seconds must be > 0, got {lease_seconds}")
        if max_attempts is not None and max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be >= 1, got {max_attempts}")
        self.engine = engine
        self.registry = registry
        self.dispatcher_id = dispatcher_id or default_dispatcher_id()
        self.batch_size = batch_size
        self.lease = timedelta(seconds=lease_seconds)
        self.max_attempts = max_attempts
        self.backoff = backoff or BackoffPolicy()
        self.idempotency = idempotency_store or IdempotencyStore(engine, clock=clock)
        self.external_publisher = external_publisher
        self.lock_provider = lock_provider
        self.observers = list(observers)
        self.clock = clock

    async def dispatch_once(self) -> DispatchResult:
        """Claim one batch, deliver it, record the outcomes."""
        if self.lock_provider is not None and not await self.lock_provider.acquire():
            return DispatchResult()
        try:
            result = await self._round()
        finally:
            if self.lock_provider is not None:
                await self.lock_provider.release()
        for observer in self.observers:
            await observer.observe_round(result)
        return result

    async def _round(self) -> DispatchResult:
        claimed_at = self.clock()
        async with self.engine.begin() as conn:
            claimed = await store.claim_batch(
                conn,
                dispatcher_id=self.dispatcher_id,
                batch_size=self.batch_size,
                lease=self.lease,
                now=claimed_at,
            )
        if not claimed:
            return DispatchResult()
        envelopes: dict[str, EventEnvelope] = {}
        outcomes: list[_Outcome] = []
        for row in claimed:
            envelope, problem = self._decode(row)
            if envelope is None:
                outcomes.append(_Outcome(row, "dead_letter", problem, f"permanent: {problem}"))
            elif row.attempt_count > self._budget(row):
                why = (
                    f"attempts exhausted ({row.attempt_count - 1}/{self._budget(row)}); the last "
                    "lease expired before completion (dispatcher crash or handler over the lease)"
                )
                outcomes.append(_Outcome(row, "dead_letter", why, why))
            else:
                envelopes[row.event_id] = envelope
        deliverable = [r for r in claimed if r.event_id in envelopes]
        records: list[HandlerRunRecord] = []
        if self.external_publisher is not None:
            outcomes += await self._relay(deliverable, envelopes)
        else:
            done = await self._succeeded_handlers(deliverable)
            # Stop starting handlers once most of the lease is spent: a row handled after its
            # lease expired may be handled again by another dispatcher meanwhile.
            deadline = claimed_at + self.lease * LEASE_BUDGET
            for row in deliverable:
                if self.clock() >= deadline:
                    outcomes.append(_Outcome(row, "unattempted"))
                    continue
                outcome, row_records = await self._run_handlers(row, envelopes[row.event_id], done)
                outcomes.append(outcome)
                records += row_records
        return await self._complete(len(claimed), outcomes, records)

    def _budget(self, row: ClaimedRow) -> int:
        """The row's attempt budget, unless this dispatcher overrides every row's."""
        return self.max_attempts if self.max_attempts is not None else row.max_attempts

    async def _succeeded_handlers(self, rows: list[ClaimedRow]) -> set[tuple[str, str]]:
        """Handler runs that already succeeded, looked up only for rows delivered before.

        A first attempt of a never-replayed event cannot have any (a crash after a
        handler ran but before completion shows up as a later attempt), so the
        common case costs no query.
        """
        seen_before = [
            r.event_id for r in rows if r.attempt_count > 1 or int(r.values["replay_count"]) > 0
        ]
        if not seen_before:
            return set()
        async with read_only_engine(self.engine).connect() as conn:
            return await self.idempotency.succeeded_handlers(conn, seen_before)

    def _decode(self, row: ClaimedRow) -> tuple[EventEnvelope | None, str]:
        values = row.values
        try:
            payload = row.decoded_payload()
        except ValueError as exc:
            return None, f"corrupt payload: not valid JSON ({exc})"
        try:
            self.registry.validate_event(
                values["event_type"], int(values["event_version"]), payload, values["tenant_id"]
            )
        except EventValidationError as exc:
            return None, f"schema: {exc}"
        return EventEnvelope.from_row({**values, "payload": payload}), ""

    async def _run_handlers(
        self, row: ClaimedRow, envelope: EventEnvelope, done: set[tuple[str, str]]
    ) -> tuple[_Outcome, list[HandlerRunRecord]]:
        records: list[HandlerRunRecord] = []
        context_token = _task_context.set(envelope.task_context())
        try:
            for registered in self.registry.handlers_for(envelope.event_type):
                if (envelope.event_id, registered.key) in done:
                    continue  # already succeeded on an earlier delivery
                invocation = HandlerInvocation(envelope, registered.key, self.idempotency)
                handler_token = _handler_invocation.set(invocation)
                try:
                    await registered.handler(envelope)
                except EventHandlerPermanentError as exc:
                    error = f"permanent: {registered.key}: {exc}"
                    records.append(
                        HandlerRunRecord(envelope.event_id, registered.key, False, error)
                    )
                    return _Outcome(row, "dead_letter", error, error), records
                except Exception as exc:
                    error = f"{registered.key}: {type(exc).__name__}: {exc}"
                    log.debug("handler failed for event %s: %s", envelope.event_id, error)
                    records.append(
                        HandlerRunRecord(envelope.event_id, registered.key, False, error)
                    )
                    return _Outcome(row, "failed", error), records
                finally:
                    _handler_invocation.reset(handler_token)
                records.append(HandlerRunRecord(envelope.event_id, registered.key, True))
        finally:
            _task_context.reset(context_token)
        return _Outcome(row, "published"), records

    async def _relay(
        self, rows: list[ClaimedRow], envelopes: Mapping[str, EventEnvelope]
    ) -> list[_Outcome]:
        assert self.external_publisher is not None
        if not rows:
            return []
        try:
            sent = await self.external_publisher.publish([envelopes[r.event_id] for r in rows])
        except Exception as exc:  # a publisher bug or outage: fail the call, never lose rows
            error = f"external publisher: {type(exc).__name__}: {exc}"
            log.warning("%s", error)
            return [_Outcome(r, "failed", error) for r in rows]
        outcomes = []
        for row in rows:
            if row.event_id in sent.published:
                outcomes.append(_Outcome(row, "published"))
            elif row.event_id in sent.unattempted:
                outcomes.append(_Outcome(row, "unattempted"))
            else:
                error = sent.failed.get(row.event_id, "not confirmed by the external publisher")
                outcomes.append(_Outcome(row, "failed", error))
        return outcomes

    async def _complete(
        self, claimed: int, outcomes: list[_Outcome], records: list[HandlerRunRecord]
    ) -> DispatchResult:
        published = failed = dead = lost = 0
        async with self.engine.begin() as conn:
            now = self.clock()
            fence = store.Fence(self.dispatcher_id, now)
            wins = [
                (o.row.event_id, o.row.claim_version) for o in outcomes if o.kind == "published"
            ]
            done = await store.mark_published(conn, wins, fence)
            published = len(done)
            lost += len(wins) - published
            # Run records matter only for events that can be delivered again; a published
            # event is final (replay takes dead letters only), so its row is the record.
            await self.idempotency.record_handler_runs(
                conn, [r for r in records if r.event_id not in done]
            )
            untouched = [
                (o.row.event_id, o.row.claim_version) for o in outcomes if o.kind == "unattempted"
            ]
            released = await store.release_unattempted(conn, untouched, fence)
            lost += len(untouched) - len(released)
            for o in outcomes:
                if o.kind == "failed" and o.row.attempt_count < self._budget(o.row):
                    retry_at = now + self.backoff.delay(o.row.attempt_count)
                    ok = await store.mark_failed(
                        conn,
                        o.row.event_id,
                        o.row.claim_version,
                        fence,
                        error=o.error or "failed",
                        next_retry_at=retry_at,
                    )
                    failed += ok
                elif o.kind in ("failed", "dead_letter"):
                    reason = o.reason or (
                        f"max attempts reached ({o.row.attempt_count}/{self._budget(o.row)}): "
                        f"{o.error}"
                    )
                    ok = await store.mark_dead_letter(
                        conn,
                        o.row.event_id,
                        o.row.claim_version,
                        fence,
                        error=o.error or reason,
                        reason=reason,
                    )
                    dead += ok
                else:
                    continue
                if not ok:
                    lost += 1
        if lost:
            log.warning("dispatcher %s lost the lease on %d event(s)", self.dispatcher_id, lost)
        if failed or dead:
            # One line per round, not per event: a handler outage must not flood the log.
            first = next(o for o in outcomes if o.kind in ("failed", "dead_letter"))
            log.warning(
                "dispatcher %s: %d failed (retrying), %d dead-lettered of %d claimed; "
                "first: event %s: %s",
                self.dispatcher_id,
                failed,
                dead,
                claimed,
                first.row.event_id,
                first.error,
            )
        return DispatchResult(claimed, published, failed, dead, lost)
