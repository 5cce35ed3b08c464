"""Claim due events, deliver them concurrently, and record each outcome under the lease.

Why one module (about 1,250 lines): a round's claim, concurrent delivery and fenced
writes share one batch's lease budget and in-flight state (and, for a relay, the
batch claimed ahead); apart, the checks of when a handler may still start, or a
batch claimed ahead may still be kept, would sit away from the writes they protect.

One round (``dispatch_once``):

1. claims a batch in one statement (see ``engine.dispatch.store``): unordered rows, and the
   head of each ordering key (at most one event per key, only when no other event
   of the key is in flight);
2. delivers the batch concurrently, at most ``max_concurrency`` events at a time:
   to the registered handlers (each under ``handler_timeout_seconds``), or to an
   external publisher such as the RabbitMQ relay. No handler starts once
   ``LEASE_BUDGET`` of the lease is spent, nor when less than the handler timeout
   is left of it, nor after ``stop`` is set: those events go back unattempted;
3. writes outcomes as they arrive, in small batches (``_Completions``), so a crash
   re-runs as little finished work as possible. Every write is fenced by the
   claim's token, so a dispatcher whose lease expired (and whose rows another
   dispatcher has since reclaimed) changes nothing.

With ``prefetch`` (the run loop's), a round with a full batch claims the next one
while its handlers run (PostgreSQL) or its relay's confirms are outstanding, and keeps
it for the next round only if every event was published; otherwise, and on stop
(``release_prefetched``), it goes back unattempted. With ``overlap_rounds`` (the run
loop's too), a round whose events have all started, clean so far, hands off once that
batch is claimed: the next round starts beside its last calls, which finish behind it
within the same ``max_concurrency``, so one slow handler holds a slot, not the
dispatcher. See docs/dispatcher.md.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import socket
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from engine.clock import Clock, utc_now
from engine.context import _handler_invocation, _task_context
from engine.dispatch import store
from engine.dispatch.backoff import BackoffPolicy
from engine.dispatch.handler_timeouts import HandlerTimedOut, HandlerTimeouts
from engine.dispatch.store import PAYLOAD_TOO_DEEP, ClaimedRow
from engine.errors import ConfigurationError, EventHandlerPermanentError, EventValidationError
from engine.handlers.idempotency import HandlerRunRecord, IdempotencyStore
from engine.operating import pauses
from engine.storage.database import (
    DISPATCHER_BUSY_TIMEOUT_SECONDS,
    mask_secrets,
    read_only_engine,
    waiting_at_most,
)
from engine.storage.schema import DEAD_LETTER, FAILED, PUBLISHED
from engine.writing.envelope import EventEnvelope, attach_raw_payload, delivered_envelope
from engine.writing.registry import EventRegistry, RegisteredHandler

log = logging.getLogger("engine.dispatcher")

# Share of the lease a batch may use for starting handlers; the rest is margin for the
# last handler and the completion write.
LEASE_BUDGET = 0.8
DEFAULT_MAX_CONCURRENCY = 200
# One limit for the API and the settings: a claim's completion statements carry two
# parameters per row, well inside every driver's limit at this size.
MAX_BATCH_SIZE = 1000
DEFAULT_HANDLER_TIMEOUT = 10.0
# Completions in doubt kept for counting at once (a few rounds' worth; more go uncounted).
IN_DOUBT_LIMIT = 4 * MAX_BATCH_SIZE


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
    of the three sets is treated as failed. ``unavailable``: ids of ``failed``
    whose failure was the broker being away, not the event; such a failure is
    retried with backoff like any other but never spends an event's last
    attempt, so an outage, however long, dead-letters nothing.
    """

    published: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    unattempted: set[str] = field(default_factory=set)
    unavailable: set[str] = field(default_factory=set)


class ExternalPublisher(Protocol):
    """Delivers events somewhere else (a broker) instead of calling local handlers.

    It may also have ``async def ready() -> bool`` (a circuit breaker: the
    dispatcher claims nothing while it answers False), ``waiting_reason: str |
    None`` (shown in heartbeats) and ``async def prepare(envelopes)`` (a batch
    claimed ahead, likely the next ``publish``: work it can do early), as the
    RabbitMQ relay does.
    """

    async def publish(self, envelopes: Sequence[EventEnvelope]) -> ExternalPublishResult: ...


class LockProvider(Protocol):
    """A coarse cross-process lock taken around each claim round (optional)."""

    async def acquire(self) -> bool: ...

    async def release(self) -> None: ...


class DispatchObserver(Protocol):
    """Told about every round (metrics)."""

    async def observe_round(self, result: DispatchResult) -> None: ...


@dataclass(slots=True)  # not frozen: one per event, and frozen fields cost 1k instructions each
class _Outcome:
    """What became of one claimed row, and the handler runs behind it.

    ``runs`` are the run records of a delivery that did not end published (the
    handlers that succeeded before one failed, and the failure). A published one
    carries ``ran``, its event type's handlers, and no records: its row is the record.
    Only if the completion's fence refuses it are their successes written, so the
    dispatcher that took the row over skips them.
    """

    row: ClaimedRow
    kind: str  # "published" | "failed" | "dead_letter" | "unattempted"
    error: str | None = None
    reason: str | None = None
    runs: list[HandlerRunRecord] | None = None
    ran: tuple[RegisteredHandler, ...] = ()
    away: bool = False  # failed because the external publisher's broker was away


@dataclass(slots=True)
class _Batch:
    """A claimed batch, decoded: deliverable envelopes by id, and the rows set apart."""

    claimed_at: datetime
    rows: list[ClaimedRow]
    envelopes: dict[str, EventEnvelope] = field(default_factory=dict)
    undeliverable: list[_Outcome] = field(default_factory=list)

    def deliverable(self) -> list[ClaimedRow]:
        """The rows to deliver, in claim order."""
        return [r for r in self.rows if r.event_id in self.envelopes]


def _runs_until(
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


def _successes_refused(
    outcomes: Sequence[_Outcome], done: Collection[str]
) -> list[HandlerRunRecord]:
    """Success records of the published outcomes whose completion the fence refused.

    The dispatcher that took the rows over delivers them again; with these it skips
    the handlers that already ran.
    """
    runs: list[HandlerRunRecord] = []
    for o in outcomes:
        if o.kind != "published" or o.row.event_id in done:
            continue
        runs.extend(HandlerRunRecord(o.row.event_id, h.key, True) for h in o.ran)
    return runs


def _type_and_tenant(row: ClaimedRow) -> tuple[str, str]:
    return str(row.values["event_type"]), str(row.values["tenant_id"])


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
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        handler_timeout_seconds: float | None = None,
        backoff: BackoffPolicy | None = None,
        idempotency_store: IdempotencyStore | None = None,
        external_publisher: ExternalPublisher | None = None,
        lock_provider: LockProvider | None = None,
        observers: Sequence[DispatchObserver] = (),
        clock: Clock = utc_now,
        prefetch: bool = False,
        overlap_rounds: bool = False,
    ) -> None:
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ConfigurationError(
                f"batch_size must be between 1 and {MAX_BATCH_SIZE}, got {batch_size}"
            )
        if lease_seconds <= 0:
            raise ConfigurationError(f"lease_seconds must be > 0, got {lease_seconds}")
        if max_attempts is not None and max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be >= 1, got {max_attempts}")
        if max_concurrency < 1:
            raise ConfigurationError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if handler_timeout_seconds is None:
            handler_timeout_seconds = min(DEFAULT_HANDLER_TIMEOUT, lease_seconds / 2)
        if not 0 < handler_timeout_seconds < lease_seconds:
            raise ConfigurationError(
                f"handler_timeout_seconds must be > 0 and below lease_seconds "
                f"({lease_seconds:g}), got {handler_timeout_seconds:g}"
            )
        self.engine = engine
        self._reader = read_only_engine(engine)  # made once: each call builds a new view
        self._claimer = waiting_at_most(engine, DISPATCHER_BUSY_TIMEOUT_SECONDS)
        self.registry = registry
        self.dispatcher_id = dispatcher_id or default_dispatcher_id()
        self.batch_size = batch_size
        self.lease = timedelta(seconds=lease_seconds)
        self.max_attempts = max_attempts
        self.max_concurrency = max_concurrency
        self.handler_timeout = handler_timeout_seconds
        self.backoff = backoff or BackoffPolicy()
        self.idempotency = idempotency_store or IdempotencyStore(engine, clock=clock)
        self.external_publisher = external_publisher
        self.lock_provider = lock_provider
        self.observers = list(observers)
        self.clock = clock
        # SQLite has one writer: a claim ahead would queue behind the round's own
        # completion writes, so only a relay (whose confirms leave the database idle)
        # claims ahead there. On PostgreSQL the claim runs while the handlers do.
        self.prefetch = prefetch and (
            external_publisher is not None or engine.dialect.name != "sqlite"
        )
        self._key_cursor = ""
        self._include_cursor_key = False
        self._seq_floor = 0  # store.claim_batch's keyset floor, and when it last was 0
        self._floor_since = datetime.min.replace(tzinfo=UTC)
        self._ordered_first = True
        self._ranges: tuple[str, ...] | None = None  # the claim's plan (store.claim_batch)
        self._prefetched: _Batch | None = None
        # With ``overlap_rounds`` (the run loop's), a round whose every event has started
        # and whose next batch is claimed ahead returns; its last handlers finish behind
        # the next round (``_finish_behind``), within the same ``max_concurrency``. Not
        # with a dispatcher lock (one active dispatcher: a round behind would outlive
        # the lock) nor for a relay (its publish is one call per batch).
        self.overlap_rounds = (
            overlap_rounds
            and self.prefetch
            and lock_provider is None
            and external_publisher is None
        )
        # Rounds finishing behind: the task writing each one's last outcomes, and its workers.
        self._behind: list[tuple[asyncio.Task[None], _Workers]] = []
        self._behind_error: Exception | None = None
        # Counts no round has returned yet (see report_unreported).
        self._unreported = DispatchResult()
        # Claims whose completion write raised: it may have committed all the same.
        self._in_doubt: dict[str, int] = {}

    @property
    def start_budget(self) -> timedelta:
        """How long after the claim a handler may still start (see the module docstring)."""
        return min(self.lease * LEASE_BUDGET, self.lease - timedelta(seconds=self.handler_timeout))

    async def dispatch_once(self, stop: asyncio.Event | None = None) -> DispatchResult:
        """Claim one batch, deliver it, record the outcomes.

        Once ``stop`` is set, events not yet started go back unattempted; the ones
        in flight finish (each handler within its timeout) and are recorded.
        """
        result = DispatchResult()
        if self.lock_provider is not None and not await self.lock_provider.acquire():
            await self.release_prefetched()  # another dispatcher holds the lock now
        else:
            try:
                await self._settle_in_doubt()
                result = await self._round(stop)
            finally:
                if self.lock_provider is not None:
                    await self.lock_provider.release()
        return await self.report_unreported(result)

    async def report_unreported(self, result: DispatchResult | None = None) -> DispatchResult:
        """``result`` plus what happened since the last report that no round returned:
        completions in doubt that landed, lost leases of hand-backs, and the counts of a
        round that raised after some of its writes. Observers see the sum. The run loop
        calls this once more on stop, so totals and metrics miss nothing."""
        result = (result or DispatchResult()) + self._unreported
        self._unreported = DispatchResult()
        for observer in self.observers:
            await observer.observe_round(result)
        return result

    def _doubt(self, outcomes: Iterable[_Outcome]) -> None:
        """Remember completions whose write raised, to count the ones that landed later."""
        for o in outcomes:
            if o.kind != "unattempted" and len(self._in_doubt) < IN_DOUBT_LIMIT:
                self._in_doubt[o.row.event_id] = o.row.claim_version

    async def _settle_in_doubt(self) -> None:
        """Count the completions in doubt that the database did commit.

        A write whose commit was cut off (the server restarted mid-COMMIT) may have
        landed; without this, the totals and metrics would miss those events for
        good, as no one delivers them again. The ones that did not land go back to
        the pool when their lease expires and are counted when next completed.
        """
        if not self._in_doubt:
            return
        asked = list(self._in_doubt.items())
        async with self._reader.connect() as conn:
            landed = await store.completions_landed(conn, asked)
        # Only what was asked about: a round finishing behind may have added more meanwhile.
        for event_id, claim_version in asked:
            if self._in_doubt.get(event_id) == claim_version:
                del self._in_doubt[event_id]
        statuses = collections.Counter(landed.values())
        self._unreported = self._unreported + DispatchResult(
            published=statuses[PUBLISHED],
            failed=statuses[FAILED],
            dead_lettered=statuses[DEAD_LETTER],
        )

    async def _publisher_ready(self) -> bool:
        """False while the external publisher's circuit is open (see ExternalPublisher)."""
        ready = getattr(self.external_publisher, "ready", None)
        return ready is None or bool(await ready())

    @property
    def waiting_for(self) -> str | None:
        """What the external publisher waits for (a broker outage), if anything."""
        reason = getattr(self.external_publisher, "waiting_reason", None)
        return reason if isinstance(reason, str) else None

    @property
    def served_types(self) -> list[str]:
        """The event types this dispatcher can deliver, so the only ones it claims.

        A relay publishes every registered type; local delivery serves the types
        that have a handler in this process. Other events stay pending for a
        dispatcher that serves them (another service sharing the database, the
        next version during a rolling deploy) instead of being dead-lettered as
        unknown or marked published with nothing run.
        """
        if self.external_publisher is not None:
            return sorted({event_type for event_type, _version in self.registry.event_types()})
        return sorted({h.event_type for h in self.registry.all_handlers()})

    async def _claim_scope(self, conn: AsyncConnection) -> store.ClaimScope:
        """What this round may claim: the served types, less what operators paused.

        Pauses are read in the claim's own transaction, so every dispatcher on every
        machine obeys a pause from its next round on.
        """
        paused = pauses.claim_filter(await pauses.active_pauses(conn))
        return store.ClaimScope(frozenset(self.served_types) - paused.event_types, paused.pairs)

    async def _round(self, stop: asyncio.Event | None) -> DispatchResult:
        await self._join_behind(wait=False)
        if self._behind_error is not None:  # the round behind could not write its outcomes
            error, self._behind_error = self._behind_error, None
            held, self._prefetched = self._prefetched, None
            await self._release_or_warn(held)  # not held through the run loop's back-off
            raise error
        held, self._prefetched = self._prefetched, None
        if self.external_publisher is not None and not await self._publisher_ready():
            await self._release(held)
            return DispatchResult()  # the broker is away: claim nothing, spend nothing
        stopping = stop is not None and stop.is_set()
        if held is not None and (stopping or self.clock() >= held.claimed_at + self.start_budget):
            await self._release(held)  # stopping, or held too long to start it safely
            held = None
        if held is not None:
            held = await self._without_paused(held)
        batch = held if held is not None else await self._claim()
        if not batch.rows:
            return DispatchResult()
        completions = _Completions(self, len(batch.rows))
        completions.add_all(batch.undeliverable)
        stopping = stop is not None and stop.is_set()
        try:
            handed_off = await self._deliver_and_record(batch, completions, stop, stopping)
        except BaseException:
            # Writes that succeeded before the error happened all the same: the next
            # report carries them (a storage error ends this round, not the count).
            self._unreported = self._unreported + completions.result
            raise
        if handed_off:  # what it writes from now on is reported by a later round
            result, completions.result = completions.result, DispatchResult()
            return result
        return completions.result

    @property
    def holds_claimed_batch(self) -> bool:
        """Whether a batch claimed ahead waits for the next round (so do not idle)."""
        return self._prefetched is not None

    async def _join_behind(self, *, wait: bool) -> None:
        """Collect the rounds finished behind (with ``wait``, every one, once it ends);
        keep the first error for the next round to raise."""
        for entry in list(self._behind):
            task, _workers = entry
            if not (wait or task.done()):
                continue
            self._behind.remove(entry)
            try:
                await task
            except asyncio.CancelledError:
                # Cancelled while waiting: none of the rounds behind may outlive this one.
                for other, _ in self._behind:
                    other.cancel()
                await asyncio.gather(*(t for t, _ in self._behind), return_exceptions=True)
                self._behind.clear()
                raise
            except Exception as exc:
                if self._behind_error is None:
                    self._behind_error = exc

    def _calls_behind(self) -> int:
        """Handler calls in flight in the rounds finishing behind."""
        return sum(workers.in_calls for _task, workers in self._behind)

    async def _finish_behind(self, workers: _Workers, completions: _Completions) -> None:
        """The last handlers of a round that handed off: await them, write their outcomes."""
        try:
            await workers.finish()
        finally:
            try:
                await completions.close()
            finally:
                self._unreported = self._unreported + completions.result

    async def _deliver_and_record(
        self,
        batch: _Batch,
        completions: _Completions,
        stop: asyncio.Event | None,
        stopping: bool,
    ) -> bool:
        """Deliver (or relay) the batch while claiming the next one ahead, if worth it, and
        write the outcomes; keep or hand back the batch claimed ahead.

        True: the round handed off (``overlap_rounds``): every event has started, the
        batch claimed ahead is kept for the next round, and the handlers still running
        finish behind it, their outcomes written as they end.
        """
        deliverable = batch.deliverable()
        upcoming: asyncio.Task[_Batch] | None = None
        worth_it = self.prefetch and self._worth_claiming_ahead(batch)
        progress = asyncio.Event()  # wakes the workers' wait to hand off

        def claim_ahead() -> None:
            nonlocal upcoming, worth_it
            if worth_it and not (stop is not None and stop.is_set()):  # not once stopping
                upcoming = asyncio.create_task(self._claim())
                upcoming.add_done_callback(lambda _task: progress.set())
            worth_it = False  # once a round

        def may_hand_off(in_calls: int) -> bool:
            """Every event started: may the next round start beside the calls in flight?"""
            return (
                upcoming is not None
                and upcoming.done()
                and not upcoming.cancelled()
                and upcoming.exception() is None
                and bool(upcoming.result().rows)
                and completions.setbacks == len(batch.undeliverable)  # clean so far
                and not completions.write_failed
                and not (stop is not None and stop.is_set())
                # the next round's first call fits beside every call still in flight
                and in_calls + self._calls_behind() < self.max_concurrency
            )

        handed_off = False
        try:
            if self.external_publisher is not None:
                if stopping:
                    completions.add_all([_Outcome(r, "unattempted") for r in deliverable])
                else:
                    claim_ahead()  # while the confirms are outstanding
                    completions.add_all(await self._relay(deliverable, batch.envelopes))
            else:
                behind = await self._deliver(
                    deliverable,
                    batch.envelopes,
                    batch.claimed_at,
                    stop,
                    completions,
                    claim_ahead,
                    may_hand_off if self.overlap_rounds else None,
                    progress,
                )
                if behind is not None:
                    assert upcoming is not None  # may_hand_off saw it claimed
                    self._prefetched = upcoming.result()
                    finishing = asyncio.create_task(self._finish_behind(behind, completions))
                    self._behind.append((finishing, behind))
                    handed_off = True
        finally:
            if not handed_off:
                await self._close_round(batch, completions, upcoming, stop)
        return handed_off

    async def _close_round(
        self,
        batch: _Batch,
        completions: _Completions,
        upcoming: asyncio.Task[_Batch] | None,
        stop: asyncio.Event | None,
    ) -> None:
        """Write the round's last outcomes; keep the batch claimed ahead only after a clean
        round (every event published) that is not stopping, else hand it back."""
        clean = completions.setbacks == len(batch.undeliverable)
        closing = asyncio.ensure_future(completions.close())
        try:
            if upcoming is not None and clean:
                await self._prepare(upcoming)  # while this round's completion commits
        finally:
            written = False
            try:
                await closing
                written = True
            finally:
                if upcoming is not None:
                    stopping = stop is not None and stop.is_set()
                    keep = written and clean and not stopping
                    await self._keep_or_release(upcoming, keep=keep)

    async def _claim(self) -> _Batch:
        """Claim a batch in one transaction and decode it (undeliverable rows set apart)."""
        claimed_at = self.clock()
        if claimed_at - self._floor_since >= store.SEQ_FLOOR_RESET:
            self._seq_floor = 0  # now and then from the first row: retries below the floor
        if self._seq_floor == 0:
            self._floor_since = claimed_at
        async with self._claimer.connect() as conn:
            await conn.begin()
            batch = await store.claim_batch(
                conn,
                scope=await self._claim_scope(conn),
                dispatcher_id=self.dispatcher_id,
                batch_size=self.batch_size,
                lease=self.lease,
                now=claimed_at,
                key_cursor=self._key_cursor,
                include_cursor_key=self._include_cursor_key,
                seq_floor=self._seq_floor,
                ordered_first=self._ordered_first,
                ranges=self._ranges,
            )
            claimed = await self._decoded_while_committing(conn, _Batch(claimed_at, batch.rows))
        self._seq_floor, self._ranges = batch.seq_floor, batch.ranges
        # Unordered and ordered rows take turns at filling the batch first.
        self._key_cursor, self._include_cursor_key = batch.key_cursor, batch.include_cursor_key
        self._ordered_first = not self._ordered_first
        return claimed

    async def _decoded_while_committing(self, conn: AsyncConnection, claimed: _Batch) -> _Batch:
        """Commit the claim, and decode its rows while the commit is on its way.

        Decoding is Python work of a few µs a row; the commit is a wait on the database
        (SQLite's fsync, in aiosqlite's thread, or PostgreSQL's round trip). Done one
        after the other they added up. The batch is returned, and so its handlers start,
        only once the commit is done: until then another dispatcher may take the rows.
        """
        committing = asyncio.ensure_future(conn.commit())
        try:
            await asyncio.sleep(0)  # the commit is sent before the decoding holds the loop
            self._decode_into(claimed)
        finally:
            # Shielded: a cancellation meanwhile must not cut the commit short while the
            # connection closes under it; the commit's own error, if any, is raised.
            await asyncio.shield(committing)
        return claimed

    def _decode_into(self, claimed: _Batch) -> None:
        """Sort the claimed rows into envelopes to deliver and outcomes to write at once."""
        for row in claimed.rows:
            clean = self._clean_envelope(row)
            if clean is not None:
                claimed.envelopes[clean.event_id] = clean
                continue
            envelope, problem = self._decode(row)
            if envelope is None and problem.startswith("corrupt row"):
                claimed.undeliverable.append(_Outcome(row, "dead_letter", problem, problem))
            elif envelope is None:
                claimed.undeliverable.append(
                    _Outcome(row, "dead_letter", problem, f"permanent: {problem}")
                )
            elif row.attempt_count > self._budget(row):
                why = (
                    f"attempts exhausted ({row.attempt_count - 1}/{self._budget(row)}); the last "
                    "lease expired before completion (dispatcher crash or handler over the lease)"
                )
                claimed.undeliverable.append(_Outcome(row, "dead_letter", why, why))
            else:
                claimed.envelopes[row.event_id] = envelope

    def _worth_claiming_ahead(self, batch: _Batch) -> bool:
        """Whether to claim the next batch while this one is delivered.

        A full batch says more rows are waiting: claimed beside this one's handlers (or
        confirms), the next round need not start by waiting for its claim. Local
        delivery claims ahead only once its handlers wait (``_deliver`` says when: two
        handlers are mid-call at once): quick handlers keep the CPU busy anyway, and
        there a claim ahead only added work (an A/B drain of no-op handlers ran 10 %
        slower with it). Not when every row is the head of an ordering key: those keys are in
        flight until this round ends, so a claim now would walk keys it cannot take.
        """
        if len(batch.rows) < self.batch_size:
            return False
        return any(row.ordering_key is None for row in batch.rows)

    async def _without_paused(self, held: _Batch) -> _Batch | None:
        """The batch claimed ahead, less rows of types paused since; those go back unattempted.

        So a pause holds every dispatcher from its next round on, also for a batch that was
        claimed before the pause. None when nothing is left to deliver.
        """
        async with self._reader.connect() as conn:
            scope = await self._claim_scope(conn)
        paused = [r for r in held.rows if not scope.admits(*_type_and_tenant(r))]
        if not paused:
            return held
        await self._release(_Batch(held.claimed_at, paused))
        gone = {r.event_id for r in paused}
        kept = _Batch(held.claimed_at, [r for r in held.rows if r.event_id not in gone])
        kept.envelopes = {i: e for i, e in held.envelopes.items() if i not in gone}
        kept.undeliverable = [o for o in held.undeliverable if o.row.event_id not in gone]
        return kept if kept.rows else None

    async def _prepare(self, upcoming: asyncio.Task[_Batch]) -> None:
        """Let the publisher build the next batch's messages ahead (``prepare``, optional).

        Called while the round's completion commits, so the building is done while the
        database works instead of before the next round's first publish. Only a speed-up:
        if anything goes wrong here, ``publish`` builds the messages itself.
        """
        prepare = getattr(self.external_publisher, "prepare", None)
        if prepare is None:
            return
        try:
            batch = await upcoming
            await prepare([batch.envelopes[r.event_id] for r in batch.deliverable()])
        except Exception as exc:
            log.debug("preparing the next batch ahead failed: %s", type(exc).__name__)

    async def _keep_or_release(self, upcoming: asyncio.Task[_Batch], keep: bool) -> None:
        """Keep the batch claimed ahead for the next round, or hand it back at once.

        It is kept only after a round whose every event was published: after a failure
        or an outage the next round may not come soon (idle wait, open circuit), and
        rows held meanwhile would wait for their lease or spend an attempt.
        """
        try:
            batch = await upcoming
        except Exception as exc:  # the next round claims again; nothing was taken
            log.debug("claiming the next batch ahead failed: %s", type(exc).__name__)
            return
        if keep and batch.rows:
            self._prefetched = batch
            return
        await self._release_or_warn(batch)

    async def _release_or_warn(self, batch: _Batch | None) -> None:
        """Hand back a batch claimed ahead; a failure is logged, not raised: the round's
        own outcome (or error) matters more, and the rows' lease expires."""
        try:
            await self._release(batch)
        except Exception as exc:
            log.warning(
                "dispatcher %s could not hand back %d event(s) claimed ahead: %s",
                self.dispatcher_id,
                len(batch.rows) if batch is not None else 0,
                type(exc).__name__,
            )

    async def release_prefetched(self) -> None:
        """Hand back the batch claimed ahead, if any, wait for the round finishing behind
        (its handlers end, each within its timeout, and their outcomes are written), and
        count the completions still in doubt (the run loop calls this on stop, then
        ``report_unreported``). Raises the first storage error of these steps; each later
        one is logged, and a failed step does not skip the ones after it."""
        held, self._prefetched = self._prefetched, None
        errors: list[Exception] = []
        try:
            await self._release(held)
        except Exception as exc:
            errors.append(exc)
        await self._join_behind(wait=True)
        if self._behind_error is not None:
            errors.append(self._behind_error)
            self._behind_error = None
        try:
            await self._settle_in_doubt()
        except Exception as exc:
            errors.append(exc)
        for later in errors[1:]:
            first_line = (str(later).strip().splitlines() or [""])[0]
            log.warning(
                "dispatcher %s: while stopping, also: %s: %s",
                self.dispatcher_id,
                type(later).__name__,
                mask_secrets(first_line, self.engine.url),
            )
        if errors:
            raise errors[0]

    async def _release(self, batch: _Batch | None) -> None:
        """Hand a batch that was claimed but never started back, spending no attempt (fenced).

        Rows it no longer held (their lease expired and another dispatcher took them
        over) are lost leases, reported with the next round (``report_unreported``).
        """
        if batch is None or not batch.rows:
            return
        claims = [(r.event_id, r.claim_version) for r in batch.rows]
        async with self.engine.begin() as conn:
            released = await store.release_unattempted(
                conn, claims, store.Fence(self.dispatcher_id, self.clock())
            )
        lost = len(claims) - len(released)
        if lost:
            log.warning(
                "dispatcher %s lost the lease on %d event(s) claimed ahead",
                self.dispatcher_id,
                lost,
            )
            self._unreported = self._unreported + DispatchResult(lost_leases=lost)

    def _budget(self, row: ClaimedRow) -> int:
        """The row's attempt budget, unless this dispatcher overrides every row's."""
        return self._budget_of(row.max_attempts)

    def _budget_of(self, stored: int) -> int:
        """The attempt budget of a row whose ``max_attempts`` column holds ``stored``."""
        return self.max_attempts if self.max_attempts is not None else stored

    async def _deliver(
        self,
        rows: list[ClaimedRow],
        envelopes: Mapping[str, EventEnvelope],
        claimed_at: datetime,
        stop: asyncio.Event | None,
        completions: _Completions,
        on_waiting: Callable[[], None],
        hand_off: Callable[[int], bool] | None = None,
        progress: asyncio.Event | None = None,
    ) -> _Workers | None:
        """Run the handlers of ``rows`` concurrently, at most ``max_concurrency`` at once
        (counting the calls of a round finishing behind).

        ``on_waiting`` is called once two handlers are mid-call at once: they wait. Once
        every row has started, ``hand_off(calls in flight)`` is asked (when ``progress``
        is set); if it agrees, the workers are returned still running (``finish()``
        awaits them), else None once they all are done.
        """
        done = await self._succeeded_handlers(envelopes.values())
        timeouts = HandlerTimeouts(self.handler_timeout)
        # A row handled after its lease expired may be handled again by another
        # dispatcher meanwhile: stop starting handlers well before that.
        deadline = claimed_at + self.start_budget

        def must_not_start() -> bool:
            return (stop is not None and stop.is_set()) or self.clock() >= deadline

        workers = _Workers(
            self,
            rows,
            envelopes,
            done,
            timeouts,
            completions,
            must_not_start,
            on_waiting,
            deadline,
            hand_off=hand_off,
            progress=progress or asyncio.Event(),
            others_in_calls=self._calls_behind,
        )
        return workers if await workers.run() else None

    async def _succeeded_handlers(self, envelopes: Iterable[EventEnvelope]) -> set[tuple[str, str]]:
        """Handler runs that already succeeded, looked up only for events delivered before.

        A first attempt of a never-replayed event cannot have any (a crash after a
        handler ran but before completion shows up as a later attempt), so the
        common case costs no query.
        """
        seen_before = [e.event_id for e in envelopes if e.attempt_count > 1 or e.replay_count]
        if not seen_before:
            return set()
        async with self._reader.connect() as conn:
            return await self.idempotency.succeeded_handlers(conn, seen_before)

    def _clean_envelope(self, row: ClaimedRow) -> EventEnvelope | None:
        """The row's envelope if nothing about it needs a closer look; None: ask ``_decode``.

        What ``_decode`` and the attempt budget check, for a row that passes them all:
        every column read once, no error built. Anything else (a corrupt row, a payload
        that is not a JSON object of the registered schema, spent attempts) goes the long
        way, which says what is wrong. On every claimed event: 2.8 against 4.7 µs, and
        368k against 337k instructions per event of a no-op drain on SQLite (callgrind).
        """
        values = row.values
        event_id, tenant_id, event_type = values["id"], values["tenant_id"], values["event_type"]
        version, attempts, max_attempts = (
            values["event_version"],
            values["attempt_count"],
            values["max_attempts"],
        )
        replays, raw = values["replay_count"], row.raw_payload
        aggregate_type, aggregate_id = values["aggregate_type"], values["aggregate_id"]
        created_at = values["created_at"]
        budget = self._budget_of(max_attempts)  # the budget this dispatcher applies
        if not (
            type(event_id) is str
            and type(tenant_id) is str
            and type(event_type) is str
            and type(version) is int
            and type(attempts) is int
            and type(max_attempts) is int
            and type(replays) is int
            and type(aggregate_type) is str
            and type(aggregate_id) is str
            and created_at is not None
            and type(raw) is str
            and max_attempts >= 1
            and attempts <= budget
        ):
            return None
        try:
            payload = store.decode_json(raw)
        except (ValueError, RecursionError):
            return None
        if not self.registry.conforms(event_type, version, payload, tenant_id):
            return None
        claim_version = int(values["claim_version"])
        return delivered_envelope(
            event_id,
            tenant_id,
            event_type,
            version,
            aggregate_type,
            aggregate_id,
            payload,
            created_at,
            attempts,
            budget,
            claim_version,
            replays,
            raw,
        )

    def _decode(self, row: ClaimedRow) -> tuple[EventEnvelope | None, str]:
        values = row.values
        corrupt = row.problem()
        if corrupt is not None:
            return None, corrupt
        try:
            payload = row.decoded_payload()
        except ValueError as exc:
            return None, f"corrupt payload: not valid JSON ({exc})"
        except RecursionError as exc:  # valid JSON, deeper than Python's decoder goes
            return None, f"corrupt payload: {PAYLOAD_TOO_DEEP} ({exc})"
        try:
            self.registry.validate_event(
                values["event_type"], int(values["event_version"]), payload, values["tenant_id"]
            )
        except EventValidationError as exc:
            return None, f"schema: {exc}"
        envelope = EventEnvelope.from_row(values, payload)
        budget = self._budget_of(envelope.max_attempts)
        if budget != envelope.max_attempts:  # the budget this dispatcher applies
            envelope = dataclasses.replace(envelope, max_attempts=budget)
        if type(row.raw_payload) is str:  # the relay sends the text as stored
            attach_raw_payload(envelope, row.raw_payload)
        return envelope, ""

    async def _run_handlers(
        self,
        row: ClaimedRow,
        envelope: EventEnvelope,
        done: set[tuple[str, str]],
        timeouts: HandlerTimeouts,
        worker: asyncio.Task[None] | None,
        deadline: datetime,
    ) -> _Outcome:
        """Run the event's handlers one after another, each within the handler timeout.

        The first one started before ``deadline`` (the round's start budget); each later
        one starts only if it is not past yet either, so no handler of the event can run
        past the lease while another dispatcher takes the event (and its key) over. An
        event whose handlers need longer fails (a retry skips the ones that succeeded).
        """
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
                    runs = _runs_until(event_id, handlers, registered.key, None)
                    return _Outcome(row, "failed", error, None, runs)
                started = True
                handler_token = _handler_invocation.set(
                    (envelope, registered.key, self.idempotency)
                )
                try:
                    await timeouts.run(registered.handler(envelope), worker)
                except EventHandlerPermanentError as exc:
                    error = f"permanent: {registered.key}: {exc}"
                    runs = _runs_until(event_id, handlers, registered.key, error)
                    return _Outcome(row, "dead_letter", error, error, runs)
                except Exception as exc:
                    if isinstance(exc, HandlerTimedOut):
                        error = f"{registered.key}: timed out after {self.handler_timeout:g} s"
                    else:
                        error = f"{registered.key}: {type(exc).__name__}: {exc}"
                    log.debug("handler failed for event %s: %s", event_id, error)
                    runs = _runs_until(event_id, handlers, registered.key, error)
                    return _Outcome(row, "failed", error, None, runs)
                finally:
                    _handler_invocation.reset(handler_token)
        finally:
            _task_context.reset(context_token)
        return _Outcome(row, "published", ran=handlers)

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
                away = row.event_id in getattr(sent, "unavailable", ())  # an older publisher
                outcomes.append(_Outcome(row, "failed", error, away=away))
        return outcomes

    async def _complete(self, outcomes: Sequence[_Outcome]) -> DispatchResult:
        """Write one batch of outcomes in one transaction, each fenced by its claim."""
        published = failed = dead = lost = 0
        wins: list[tuple[str, int]] = []
        untouched: list[tuple[str, int]] = []
        setbacks: list[_Outcome] = []
        runs: list[HandlerRunRecord] = []
        for o in outcomes:
            if o.kind == "published":
                wins.append((o.row.event_id, o.row.claim_version))
            elif o.kind == "unattempted":
                untouched.append((o.row.event_id, o.row.claim_version))
            else:
                setbacks.append(o)
                if o.runs:
                    runs.extend(o.runs)
        async with self.engine.begin() as conn:
            now = self.clock()
            fence = store.Fence(self.dispatcher_id, now)
            done = await store.mark_published(conn, wins, fence)
            published = len(done)
            if published < len(wins):
                lost += len(wins) - published
                runs.extend(_successes_refused(outcomes, done))
            # Run records matter only for events that can be delivered again; a published
            # event is final (replay takes dead letters only), so its row is the record.
            await self.idempotency.record_handler_runs(conn, runs)
            released = await store.release_unattempted(conn, untouched, fence)
            lost += len(untouched) - len(released)
            for o in setbacks:
                # An outage never takes the last attempt: that one is given back.
                refund = o.away and o.row.attempt_count >= self._budget(o.row)
                if o.kind == "failed" and (refund or o.row.attempt_count < self._budget(o.row)):
                    retry_at = now + self.backoff.delay(o.row.attempt_count)
                    ok = await store.mark_failed(
                        conn,
                        o.row.event_id,
                        o.row.claim_version,
                        fence,
                        error=o.error or "failed",
                        next_retry_at=retry_at,
                        refund_attempt=refund,
                    )
                    failed += ok
                else:
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
                        release_key=self._releases_key(o.row),
                    )
                    dead += ok
                if not ok:
                    lost += 1
        return DispatchResult(0, published, failed, dead, lost)

    def _releases_key(self, row: ClaimedRow) -> bool:
        """Whether this row's dead letter lets the later events of its key go on."""
        if row.ordering_key is None:
            return False
        return self.registry.dead_letter_policy(str(row.values["event_type"])) == "skip"

    def _report(self, result: DispatchResult, first_problem: _Outcome | None) -> None:
        if result.lost_leases:
            log.warning(
                "dispatcher %s lost the lease on %d event(s)",
                self.dispatcher_id,
                result.lost_leases,
            )
        if first_problem is not None and (result.failed or result.dead_lettered):
            # One line per round, not per event: a handler outage must not flood the log.
            log.warning(
                "dispatcher %s: %d failed (retrying), %d dead-lettered of %d claimed; "
                "first: event %s: %s",
                self.dispatcher_id,
                result.failed,
                result.dead_lettered,
                result.claimed,
                first_problem.row.event_id,
                first_problem.error,
            )


class _Workers:
    """The worker tasks of one round: they take its rows in claim order from one queue.

    A task per row behind a semaphore cost twice as much per event. The pool grows only
    while every worker is inside a handler that is waiting: a worker about to call a
    handler when all the others are mid-call starts one more. Quick handlers that never
    wait are run by one worker, so a no-op batch creates no tasks; handlers that await
    I/O reach ``max_concurrency`` workers within the batch's first calls.

    A class, not a closure that starts copies of itself: such a closure names itself,
    a reference cycle that kept every round (rows, envelopes, tasks) alive until the
    cyclic garbage collector ran, a large share of the CPU per event with hundreds of
    handlers in flight. A finished round is freed by reference counting.
    """

    def __init__(
        self,
        dispatcher: OutboxDispatcher,
        rows: list[ClaimedRow],
        envelopes: Mapping[str, EventEnvelope],
        done: set[tuple[str, str]],
        timeouts: HandlerTimeouts,
        completions: _Completions,
        must_not_start: Callable[[], bool],
        on_waiting: Callable[[], None],
        deadline: datetime,
        *,
        hand_off: Callable[[int], bool] | None = None,
        progress: asyncio.Event,
        others_in_calls: Callable[[], int],
    ) -> None:
        """Once ``must_not_start()``, rows left are handed back unattempted; ``on_waiting``
        is called when a second handler call starts while another is mid-call; after
        ``deadline`` an event's next handler does not start (``_run_handlers``).
        ``others_in_calls()``: the calls of the round finishing behind, which count
        against ``max_concurrency``. ``hand_off``/``progress``: see ``run``."""
        self._dispatcher = dispatcher
        self._queue = collections.deque(rows)
        self._envelopes = envelopes
        self._done = done
        self._timeouts = timeouts
        self._completions = completions
        self._limit = min(dispatcher.max_concurrency, len(rows))
        self._tasks: list[asyncio.Task[None]] = []
        self._live = 0  # worker tasks not finished yet
        self._failed = False  # a worker raised: the round aborts
        self.in_calls = 0  # workers inside a handler call right now
        self._must_not_start = must_not_start
        self._on_waiting = on_waiting
        self._deadline = deadline
        self._hand_off = hand_off
        self._progress = progress
        self._others = others_in_calls

    async def run(self) -> bool:
        """Deliver every row (or hand it back). False: every worker has finished. True:
        every row has started and ``hand_off(calls in flight)`` agreed; the workers still
        in a call go on, and ``finish()`` awaits them. Woken by ``progress``: set when
        the last row is taken, when a worker ends, and by the caller (the claim ahead)."""
        self._spawn()
        try:
            while self._live and not self._failed:
                if not self._queue and self._hand_off is not None and self._hand_off(self.in_calls):
                    return True
                self._progress.clear()
                await self._progress.wait()
        except BaseException:
            await self._cancel_all()
            raise
        await self.finish()
        return False

    async def finish(self) -> None:
        """Wait for every worker (raising the first error); then stop the timeout watcher."""
        try:
            awaited = 0
            while awaited < len(self._tasks):  # the list grows while its first ones run
                await self._tasks[awaited]
                awaited += 1
        finally:
            if any(not task.done() for task in self._tasks):  # aborted: a worker raised
                await self._cancel_all()
            else:
                self._timeouts.close()

    async def _cancel_all(self) -> None:
        """Start nothing more, cancel every worker and wait for them: none outlives the
        round (no handler runs, nor outcome arrives, after it); then stop the watcher."""
        self._queue.clear()
        for task in self._tasks:
            task.cancel()
        try:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            self._timeouts.close()

    def _spawn(self) -> None:
        self._live += 1
        self._tasks.append(asyncio.create_task(self._work()))

    async def _work(self) -> None:
        try:
            await self._take_rows()
        except BaseException:
            self._failed = True
            raise
        finally:
            self._live -= 1
            self._progress.set()

    async def _take_rows(self) -> None:
        me = asyncio.current_task()
        queue, completions = self._queue, self._completions
        while queue:
            row = queue.popleft()
            if not queue:
                self._progress.set()  # every row is taken: the round may hand off
            if self._must_not_start():
                completions.add(_Outcome(row, "unattempted"))
                continue
            self.in_calls += 1
            if self.in_calls == 2:  # another handler is mid-call: it waits (on I/O)
                self._on_waiting()
            if self.in_calls == len(self._tasks) and queue and self._room():
                self._spawn()
            try:
                outcome = await self._dispatcher._run_handlers(
                    row,
                    self._envelopes[row.event_id],
                    self._done,
                    self._timeouts,
                    me,
                    self._deadline,
                )
            finally:
                self.in_calls -= 1
            completions.add(outcome)

    def _room(self) -> bool:
        """Whether one more worker fits within ``max_concurrency`` (with the round behind)."""
        if len(self._tasks) >= self._limit:
            return False
        return len(self._tasks) + self._others() < self._dispatcher.max_concurrency


class _Completions:
    """Outcomes of one round, written in small batches while the rest is still running.

    One writer task drains what has arrived since its last write, so the batches
    grow with the arrival rate (group commit) and a crash loses only the
    outcomes of the write in progress. A storage error is kept and raised by
    ``close()``, after every handler of the round has finished; the rows it
    could not complete go back to the pool when their lease expires.
    """

    def __init__(self, dispatcher: OutboxDispatcher, claimed: int) -> None:
        self._dispatcher = dispatcher
        self._outcomes: list[_Outcome] = []
        self._arrived = asyncio.Event()
        self._closing = False
        self._error: BaseException | None = None
        self._first_problem: _Outcome | None = None
        # Outcomes other than published (failed, dead letter, handed back): a round with
        # none is clean, so the batch claimed ahead is kept.
        self.setbacks = 0
        self.result = DispatchResult(claimed=claimed)
        self._writer: asyncio.Task[None] | None = None

    def add(self, outcome: _Outcome) -> None:
        self._outcomes.append(outcome)
        if outcome.kind != "published":
            self.setbacks += 1
        if self._first_problem is None and outcome.kind in ("failed", "dead_letter"):
            self._first_problem = outcome
        self._arrived.set()
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop())

    @property
    def write_failed(self) -> bool:
        """Whether the database refused one of this round's writes."""
        return self._error is not None

    def add_all(self, outcomes: Sequence[_Outcome]) -> None:
        for outcome in outcomes:
            self.add(outcome)

    async def close(self) -> None:
        """Write what is left; raise the first storage error of the round, if any."""
        self._closing = True
        self._arrived.set()
        if self._writer is not None:
            await self._writer
        self._dispatcher._report(self.result, self._first_problem)
        if self._error is not None:
            raise self._error

    async def _write_loop(self) -> None:
        while True:
            await self._arrived.wait()
            await asyncio.sleep(0)  # let outcomes that are ready now join this write
            self._arrived.clear()
            outcomes, self._outcomes = self._outcomes, []
            if outcomes:
                await self._write(outcomes)
            if self._closing and not self._outcomes:
                return

    async def _write(self, outcomes: list[_Outcome]) -> None:
        if self._error is not None:
            return  # the database refused a write this round: leave the rest to the lease
        try:
            written = await self._dispatcher._complete(outcomes)
        except Exception as exc:
            self._error = exc
            self._dispatcher._doubt(outcomes)
            return
        self.result = self.result + written
