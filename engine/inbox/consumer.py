"""The inbox's consumer loop: batches of messages written, committed, then acked.

``InboxConsumer.run`` takes what the broker delivered since the last batch (at most
``max_batch`` messages), turns each message into a row (engine.inbox.rows), inserts them
in one transaction (engine.inbox.writer) and acks them with one ``multiple`` ack after
the commit, never before. While a batch commits the next one gathers, so batches grow
with the load and a lone message is written at once.

- **A message never crashes the consumer**: one that cannot be decoded becomes a
  dead-lettered row (engine.inbox.rows), acked like any other.
- **Database away**: the batch in hand is tried again with a growing pause
  (``storage_retry_initial_seconds`` doubling to ``storage_retry_max_seconds``), unacked;
  the broker sends no more than ``prefetch`` unacked messages, so the consumer stops
  taking messages until the write succeeds. Each try gives the rows new local ids: a
  commit that was cut off but landed leaves identified rows that the retry skips as
  duplicates.
- **Broker away**: the deliveries not acked are void (the broker requeues them); the
  consumer reconnects after ``probe_seconds``, doubling to ``max_probe_seconds``, and its
  heartbeat says what it waits for. A batch whose write had begun is committed first;
  its ack fails, and its messages come back as duplicates.
- **Start**: the installed apps' ``on_ready`` hooks are awaited first, as a dispatcher's
  run loop awaits them.
- **Stop** (``shutdown`` set, SIGTERM for ``outbox-tui consume``): a batch whose write
  began is committed and acked; one that waits for the database is left unacked, and so
  is every delivery not in a batch yet; the broker requeues them. Never half a batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sqlalchemy.ext.asyncio import AsyncEngine

from engine.clock import Clock, utc_now
from engine.dispatch import default_dispatcher_id
from engine.errors import BrokerUnavailableError, ConfigurationError, StorageError
from engine.inbox.broker import Delivery, Subscription
from engine.inbox.decoding import decode_message
from engine.inbox.heartbeat import (
    CONSUMER_KIND,
    ConsumerSummary,
    ConsumerTotals,
    consumer_details,
)
from engine.inbox.rows import RowBuilder
from engine.inbox.writer import InboxWriter, WriteResult
from engine.running.heartbeat import Heartbeat
from engine.running.run_loop import STORAGE_ERRORS, await_ready_hooks
from engine.running.wakeup import CommitNotifier
from engine.settings import ConsumerSettings, DispatcherSettings
from engine.storage.database import (
    DISPATCHER_BUSY_TIMEOUT_SECONDS,
    translate_storage_error,
    waiting_at_most,
)
from engine.storage.secrets import mask_secrets
from engine.writing.registry import EventRegistry

log = logging.getLogger("engine.inbox")

BROKER_AWAY = "broker unavailable"
DATABASE_AWAY = "database unavailable"
BatchCallback = Callable[["BatchReport"], None]
WaitingCallback = Callable[[str | None], None]


@dataclass(frozen=True, slots=True)
class BatchReport:
    """One committed batch (``result``) and the run's totals after it."""

    size: int
    result: WriteResult
    acked: bool
    totals: ConsumerTotals


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    """The run's pacing: heartbeats, retries after storage errors, broker probes."""

    heartbeat_seconds: float = 5.0
    heartbeat_min_interval_seconds: float = 1.0
    storage_retry_initial_seconds: float = 0.5
    storage_retry_max_seconds: float = 30.0
    probe_seconds: float = 1.0
    max_probe_seconds: float = 30.0
    connect_timeout_seconds: float = 10.0

    @classmethod
    def of(
        cls, run: DispatcherSettings, *, probe_seconds: float = 1.0, max_probe_seconds: float = 30.0
    ) -> ConsumerOptions:
        """The pacing the run loop's settings give (heartbeats, storage retries)."""
        return cls(
            heartbeat_seconds=run.heartbeat_seconds,
            heartbeat_min_interval_seconds=run.heartbeat_min_interval_seconds,
            storage_retry_initial_seconds=run.storage_retry_initial_seconds,
            storage_retry_max_seconds=run.storage_retry_max_seconds,
            probe_seconds=probe_seconds,
            max_probe_seconds=max_probe_seconds,
        )


@dataclass(slots=True)
class _State:
    waiting_for: str | None = None
    last_error: str | None = None
    connected_once: bool = False
    totals: ConsumerTotals = field(default_factory=ConsumerTotals)


class InboxConsumer:
    """Consumes ``settings.queue`` into ``engine``'s outbox (see the module docstring)."""

    def __init__(
        self,
        engine: AsyncEngine,
        registry: EventRegistry,
        settings: ConsumerSettings,
        *,
        amqp_url: str,
        options: ConsumerOptions | None = None,
        instance_id: str | None = None,
        clock: Clock = utc_now,
        notify_channel: str | None = "outbox_events",
    ) -> None:
        if not settings.queue:
            raise ConfigurationError("the inbox consumer needs a queue (--queue)")
        self.engine = engine
        self.settings = settings
        self.queue = settings.queue
        self.options = options or ConsumerOptions()
        self.instance_id = instance_id or default_dispatcher_id()
        # On SQLite a batch waits a few seconds at most for the write lock, so a stop is
        # not held up by another process's long transaction (the batch is tried again).
        self.writer = InboxWriter(waiting_at_most(engine, DISPATCHER_BUSY_TIMEOUT_SECONDS))
        self.rows = RowBuilder(
            registry, queue=self.queue, default_tenant=settings.default_tenant, clock=clock
        )
        self.subscription = Subscription(
            amqp_url,
            self.queue,
            bindings=settings.bindings,
            prefetch=settings.prefetch,
            passive=settings.passive,
            single_active_consumer=settings.single_active_consumer,
            connect_timeout=self.options.connect_timeout_seconds,
        )
        self.heartbeat = Heartbeat(
            engine,
            self.instance_id,
            kind=CONSUMER_KIND,
            min_interval=self.options.heartbeat_min_interval_seconds,
            clock=clock,
        )
        self._notifier = (
            CommitNotifier(engine, channel=notify_channel, interval_ms=100.0)
            if notify_channel and engine.dialect.name == "postgresql"
            else None
        )
        self._state = _State()
        self._on_waiting: WaitingCallback | None = None

    @property
    def totals(self) -> ConsumerTotals:
        return replace(self._state.totals)

    @property
    def waiting_for(self) -> str | None:
        """What the consumer waits for (an outage of the broker or the database), or None."""
        return self._state.waiting_for

    async def run(
        self,
        shutdown: asyncio.Event,
        *,
        max_messages: int | None = None,
        on_batch: BatchCallback | None = None,
        on_waiting: WaitingCallback | None = None,
    ) -> ConsumerSummary:
        """Consume until ``shutdown`` is set (or ``max_messages`` were acked).

        ``on_batch`` hears of every committed batch; ``on_waiting`` of every change of
        what the consumer waits for (a reason, then None once the outage is over).
        """
        state = self._state
        self._on_waiting = on_waiting
        await self._beat(force=True)
        try:
            await await_ready_hooks(self.rows.registry)  # as a run loop does, first
            while not shutdown.is_set():
                if not await self._connected(shutdown):
                    break
                left = None if max_messages is None else max_messages - state.totals.acked
                if left is not None and left <= 0:
                    break
                batch = await self._next_batch(shutdown, left)
                if batch:
                    await self._write_and_ack(batch, shutdown, on_batch)
                await self._beat()
        finally:
            await self.subscription.close()
            if self._notifier is not None:
                await self._notifier.flush()
                await self._notifier.aclose()
            await self._stop_heartbeat()
        return ConsumerSummary(replace(state.totals), shutdown.is_set(), state.last_error)

    # -- the broker ------------------------------------------------------------------------

    async def _connected(self, shutdown: asyncio.Event) -> bool:
        """Subscribed, reconnecting with a growing pause while the broker is away; False
        when a stop came first."""
        subscription, state = self.subscription, self._state
        if state.connected_once and not subscription.lost.is_set():
            return True
        delay = self.options.probe_seconds
        while not shutdown.is_set():
            if state.connected_once:
                await subscription.close()
            try:
                await subscription.open()
            except ConfigurationError:
                if not state.connected_once:
                    raise  # at start-up: the queue or the credentials are wrong
                self._away(f"{BROKER_AWAY}: refused", delay)
            except BrokerUnavailableError as exc:
                self._away(f"{BROKER_AWAY}: {exc}", delay)
            else:
                if state.connected_once:
                    state.totals.reconnects += 1
                    log.info("queue %s: connected to RabbitMQ again", self.queue)
                if state.waiting_for and state.waiting_for.startswith(BROKER_AWAY):
                    self._wait_for(None)
                state.connected_once = True
                await self._beat(force=True)
                return True
            await self._beat(force=True)
            await _first_of((shutdown,), delay)
            delay = min(max(delay * 2, 0.05), self.options.max_probe_seconds)
        return False

    def _away(self, reason: str, delay: float) -> None:
        if self._state.waiting_for != reason:
            log.warning("queue %s: %s; trying again in %.3g s", self.queue, reason, delay)
        self._wait_for(reason)

    def _wait_for(self, reason: str | None) -> None:
        """Record what the consumer waits for (None: nothing), and say so when it changed."""
        state = self._state
        if reason is not None:
            state.last_error = reason
        if reason != state.waiting_for:
            state.waiting_for = reason
            if self._on_waiting is not None:
                self._on_waiting(reason)

    async def _next_batch(self, shutdown: asyncio.Event, left: int | None) -> list[Delivery]:
        """What arrived since the last batch, up to ``max_batch`` (and ``left``); waits
        for a delivery, beating while idle. Empty on a stop or when the broker went."""
        subscription = self.subscription
        limit = self.settings.max_batch if left is None else min(self.settings.max_batch, left)
        while not subscription.taken:
            if shutdown.is_set() or subscription.lost.is_set():
                return []
            idle = self.heartbeat.seconds_until_due(self.options.heartbeat_seconds)
            await _first_of((subscription.arrived, shutdown, subscription.lost), max(idle, 0.01))
            if self.heartbeat.due(self.options.heartbeat_seconds):
                await self._beat(force=True)
        return subscription.take(limit)

    # -- one batch -------------------------------------------------------------------------

    async def _write_and_ack(
        self, batch: list[Delivery], shutdown: asyncio.Event, on_batch: BatchCallback | None
    ) -> None:
        """Write the batch (again while the database is away), then ack it; or leave it
        unacked on a stop or when the broker went meanwhile."""
        state, subscription = self._state, self.subscription
        state.totals.received += len(batch)
        limit = self.settings.max_message_bytes
        decoded = [decode_message(d.message, max_bytes=limit) for d in batch]
        delay = self.options.storage_retry_initial_seconds
        while True:
            rows = [
                self.rows.row(d.message, outcome) for d, outcome in zip(batch, decoded, strict=True)
            ]
            try:
                result = await self.writer.write(rows)
            except STORAGE_ERRORS as exc:
                state.totals.storage_errors += 1
                reason = f"{DATABASE_AWAY}: {self._describe(exc)}"
                if state.waiting_for != reason:
                    log.warning(
                        "queue %s: a batch of %d could not be written (%s); it stays unacked "
                        "and is tried again in %.3g s",
                        self.queue,
                        len(batch),
                        reason,
                        delay,
                    )
                self._wait_for(reason)
                if shutdown.is_set() or subscription.lost.is_set():
                    return  # left unacked: the broker requeues it
                await _first_of((shutdown, subscription.lost), delay)
                if shutdown.is_set() or subscription.lost.is_set():
                    return
                delay = min(delay * 2, self.options.storage_retry_max_seconds)
                continue
            break
        if state.waiting_for and state.waiting_for.startswith(DATABASE_AWAY):
            log.info("queue %s: the database is back; writing again", self.queue)
            self._wait_for(None)
        acked = await subscription.ack(batch[-1])
        totals = state.totals
        totals.batches += 1
        totals.stored += len(result.stored)
        totals.duplicates += result.duplicates
        totals.rejected += sum(1 for row in result.stored if row.kind == "dead_letter")
        totals.unknown_types += sum(1 for row in result.stored if row.kind == "unknown_type")
        if acked:
            totals.acked += len(batch)
        if self._notifier is not None and any(row.kind != "dead_letter" for row in result.stored):
            self._notifier.poke()  # wake idle dispatchers: there is work
        if on_batch is not None:
            on_batch(BatchReport(len(batch), result, acked, replace(totals)))

    # -- heartbeats ------------------------------------------------------------------------

    def _details(self) -> dict[str, object]:
        state = self._state
        return consumer_details(
            queue=self.queue,
            bindings=self.settings.bindings,
            prefetch=self.settings.prefetch,
            max_batch=self.settings.max_batch,
            totals=state.totals,
            waiting_for=state.waiting_for,
            last_error=state.last_error,
            heartbeat_seconds=self.options.heartbeat_seconds,
        )

    async def _beat(self, *, force: bool = False) -> None:
        try:
            await self.heartbeat.beat(self._details(), force=force)
        except STORAGE_ERRORS as exc:  # the database is away: the batch's retry says so
            log.debug("queue %s: heartbeat not written: %s", self.queue, self._describe(exc))

    async def _stop_heartbeat(self) -> None:
        try:
            await self.heartbeat.stop(self._details())
        except Exception as exc:  # cleanup must not hide the run's outcome
            log.warning(
                "queue %s: could not mark heartbeat %s stopped: %s",
                self.queue,
                self.instance_id,
                self._describe(exc),
            )

    def _describe(self, exc: BaseException) -> str:
        url = self.engine.url
        error = exc if isinstance(exc, StorageError) else translate_storage_error(exc, url)
        lines = str(error).strip().splitlines()
        return mask_secrets(lines[0] if lines else type(exc).__name__, url)


async def _first_of(events: tuple[asyncio.Event, ...], seconds: float) -> None:
    """Until one of ``events`` is set or ``seconds`` passed."""
    if any(e.is_set() for e in events):
        return
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
