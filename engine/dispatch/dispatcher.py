"""The dispatcher: claims due events, delivers them, records each outcome under the lease.

One round (``dispatch_once``):

1. claims a batch in one statement (``claimer``, ``claim_sql``): unordered rows, and the
   head of each ordering key (at most one event per key, only when no other event of the
   key is in flight);
2. delivers the batch concurrently, at most ``max_concurrency`` events at a time, to the
   registered handlers (``delivery``, ``handlers``, each under ``handler_timeout_seconds``)
   or to an external publisher such as the RabbitMQ relay (``relaying``). No handler
   starts once ``LEASE_BUDGET`` of the lease is spent, nor when less than the handler
   timeout is left of it, nor after ``stop`` is set: those events go back unattempted;
3. writes outcomes as they arrive, in small batches (``completions``), each behind its
   claim's fence (``fenced_writes``), so a dispatcher whose lease expired changes nothing.

``round`` says how a round claims the next batch ahead and overlaps the next round.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from engine.clock import Clock, utc_now
from engine.dispatch.backoff import DEFAULT_BACKOFF, BackoffPolicy
from engine.dispatch.batches import Batches
from engine.dispatch.claimer import Claimer
from engine.dispatch.completions import Completions, InDoubt, OutcomeWriter, Unreported
from engine.dispatch.decoding import Decoder
from engine.dispatch.delivery import LocalDelivery
from engine.dispatch.handlers import HandlerRunner
from engine.dispatch.probe import delivery_observers
from engine.dispatch.relaying import Relaying
from engine.dispatch.round import RoundLimits, Rounds, RoundsBehind
from engine.dispatch.transactions import HandlerTransactions
from engine.dispatch.types import (
    DispatchObserver,
    DispatchResult,
    ExternalPublisher,
    LockProvider,
)
from engine.errors import ConfigurationError
from engine.handlers.idempotency import IdempotencyStore
from engine.storage.database import (
    DISPATCHER_BUSY_TIMEOUT_SECONDS,
    read_only_engine,
    same_database,
    waiting_at_most,
)
from engine.storage.secrets import mask_secrets, mask_url
from engine.writing.registry import EventRegistry

log = logging.getLogger("engine.dispatcher")

# Share of the lease a batch may use for starting handlers; the rest is margin for the
# last handler and the completion write.
LEASE_BUDGET = 0.8
# Handlers in flight at once, unless set: every event of two batches, so that each round,
# and the round overlapping its last calls, can start all of its events at once.
CONCURRENCY_PER_BATCH = 2
# One limit for the API and the settings: a completion carries two values per row.
MAX_BATCH_SIZE = 1000
DEFAULT_HANDLER_TIMEOUT = 10.0


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
        max_concurrency: int | None = None,
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
        if max_concurrency is None:
            max_concurrency = CONCURRENCY_PER_BATCH * batch_size
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
        self.registry = registry
        self.dispatcher_id = dispatcher_id or default_dispatcher_id()
        self.batch_size = batch_size
        self.lease = timedelta(seconds=lease_seconds)
        self.max_attempts = max_attempts
        self.max_concurrency = max_concurrency
        self.handler_timeout = handler_timeout_seconds
        self.backoff = backoff or DEFAULT_BACKOFF
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
        # Not with a dispatcher lock (one active dispatcher: a round behind would outlive
        # the lock) nor for a relay (its publish is one call per batch).
        self.overlap_rounds = (
            overlap_rounds
            and self.prefetch
            and lock_provider is None
            and external_publisher is None
        )
        self._refuse_another_database()
        self._build_parts()

    def _refuse_another_database(self) -> None:
        """Transactional handlers commit on this dispatcher's database: refuse to start
        on another one than the database their app declared (``expect_database``)."""
        expected = self.registry.expected_database
        if expected is None or self.external_publisher is not None:
            return
        if not any(h.transactional for h in self.registry.all_handlers()):
            return
        if not same_database(expected, self.engine.url):
            raise ConfigurationError(
                f"the transactional handlers write to {mask_url(expected)}, but this "
                f"dispatcher runs on {mask_url(self.engine.url)}: their writes must commit "
                "in the outbox's own database (run the dispatcher there)"
            )

    def _build_parts(self) -> None:
        """The pieces a round is made of, each handed only what it uses."""
        reader = read_only_engine(self.engine)  # made once: each call builds a new view
        self._unreported = Unreported()
        self._in_doubt = InDoubt(reader, self._unreported)
        decoder = Decoder(self.registry, self.max_attempts)
        self.writer = OutcomeWriter(
            self.engine,
            self.dispatcher_id,
            registry=self.registry,
            decoder=decoder,
            backoff=self.backoff,
            idempotency=self.idempotency,
            clock=self.clock,
        )
        self.batches = Batches(
            self.engine,
            waiting_at_most(self.engine, DISPATCHER_BUSY_TIMEOUT_SECONDS),
            reader,
            Claimer(self.dispatcher_id, self.batch_size, self.lease),
            decoder,
            served_types=lambda: self.served_types,
            clock=self.clock,
            unreported=self._unreported,
        )
        behind = RoundsBehind()
        watching = delivery_observers(self.observers)
        self._relaying = (
            None
            if self.external_publisher is None
            else Relaying(self.external_publisher, watching, self.clock)
        )
        local = None
        if self._relaying is None:
            transactions = HandlerTransactions(
                self.engine,
                self.registry,
                self.idempotency,
                dispatcher_id=self.dispatcher_id,
                clock=self.clock,
            )
            runner = HandlerRunner(
                self.registry,
                self.idempotency,
                reader,
                transactions,
                clock=self.clock,
                handler_timeout=self.handler_timeout,
                start_budget=self.start_budget,
                lease=self.lease,
                observers=watching,
            )
            local = LocalDelivery(
                runner,
                max_concurrency=self.max_concurrency,
                clock=self.clock,
                calls_elsewhere=behind.calls,
            )
        limits = RoundLimits(
            self.batch_size,
            self.max_concurrency,
            self.start_budget,
            self.prefetch,
            self.overlap_rounds,
        )
        self.rounds = Rounds(
            self.batches,
            local=local,
            relaying=self._relaying,
            new_completions=self._new_completions,
            behind=behind,
            unreported=self._unreported,
            limits=limits,
            clock=self.clock,
        )

    def _new_completions(self, claimed: int) -> Completions:
        return Completions(
            claimed,
            writer=self.writer,
            in_doubt=self._in_doubt,
            dispatcher_id=self.dispatcher_id,
        )

    @property
    def start_budget(self) -> timedelta:
        """How long after the claim a handler may still start (see the module docstring)."""
        return min(self.lease * LEASE_BUDGET, self.lease - timedelta(seconds=self.handler_timeout))

    @property
    def served_types(self) -> list[str]:
        """The event types this dispatcher can deliver, so the only ones it claims.

        A relay publishes every registered type; local delivery serves the types that have
        a handler in this process. Other events stay pending for a dispatcher that serves
        them (another service sharing the database, the next version during a rolling
        deploy) instead of being dead-lettered as unknown or published with nothing run.
        """
        if self.external_publisher is not None:
            return sorted({event_type for event_type, _version in self.registry.event_types()})
        return sorted({h.event_type for h in self.registry.all_handlers()})

    @property
    def waiting_for(self) -> str | None:
        """What the external publisher waits for (a broker outage), if anything."""
        return None if self._relaying is None else self._relaying.waiting_for

    @property
    def holds_claimed_batch(self) -> bool:
        """Whether a batch claimed ahead waits for the next round (so do not idle)."""
        return self.rounds.held is not None

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
                await self._in_doubt.settle()
                result = await self.rounds.run(stop)
            finally:
                if self.lock_provider is not None:
                    await self.lock_provider.release()
        return await self.report_unreported(result)

    async def report_unreported(self, result: DispatchResult | None = None) -> DispatchResult:
        """``result`` plus what happened since the last report that no round returned:
        completions in doubt that landed, lost leases of hand-backs, and the counts of a
        round that raised after some of its writes. Observers see the sum. The run loop
        calls this once more on stop, so totals and metrics miss nothing."""
        result = (result or DispatchResult()) + self._unreported.take()
        for observer in self.observers:
            await observer.observe_round(result)
        return result

    async def release_prefetched(self) -> None:
        """Hand back the batch claimed ahead, if any, wait for the rounds finishing behind
        (their handlers end, each within its timeout, and their outcomes are written), and
        count the completions still in doubt (the run loop calls this on stop, then
        ``report_unreported``). Raises the first storage error of these steps; each later
        one is logged, and a failed step does not skip the ones after it."""
        held, self.rounds.held = self.rounds.held, None
        errors: list[Exception] = []
        try:
            await self.batches.release(held)
        except Exception as exc:
            errors.append(exc)
        behind = self.rounds.behind
        await behind.join(wait=True)
        if behind.error is not None:
            errors.append(behind.error)
            behind.error = None
        try:
            await self._in_doubt.settle()
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
