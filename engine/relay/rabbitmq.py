"""Relay outbox events to RabbitMQ as CloudEvents, with publisher confirms.

``RabbitMqOutboxPublisher`` is the dispatcher's ``external_publisher``. An event counts
as published only once the broker confirmed it (``Basic.Ack``); an unroutable event
(``mandatory``, returned with 312 NO_ROUTE) is *failed*, never published. Beside this
module: what each answer of the broker means (``answers``), the connection and
reconnecting (``broker``), and the circuit breaker that keeps rounds from claiming while
the broker is away (``circuit``).

Batching: publishes run concurrently and all confirms are awaited together, so a
batch waits for its confirms once, not once per event. A round makes at most two
calls: the first attempts together, then the retries together; a round of retries
only sends the retry with the most attempts left alone first. ``confirm_timeout``
is one deadline per call (its publishes start together). ``prepare()`` builds
the messages of the batch the dispatcher claimed ahead while it commits the
last round, so the next call starts sending at once.

Outages: only a publish that may have reached the broker spends an attempt.
When nothing was sent (the connect failed or was refused, or the channel was
already dead when the publish reached it: ``ChannelInvalidStateError``, raised
before any frame is written), those events are reported *unattempted* and go
back without spending an attempt, however small their budget. When the
connection drops while publishes are out (sent, confirm outstanding), those
events are failed with ``broker unavailable: ...`` so the dispatcher's backoff
applies, and the later call of the round is reported unattempted. The first
call doubles as the probe (first attempts when the round has any, else the one
retry with the most attempts left), so an outage that strikes mid-call spends
no retry's attempt but that one; retries close to their limit are held back, so
an outage does not fill the dead letter. A failed confirm may still have
reached the broker: delivery is at-least-once and consumers dedupe by
``message_id`` (the event id).

One message the broker refuses (larger than its ``max_message_size``) closes the whole
channel, and every publish still waiting for its confirm fails with it. That is no
outage: each of those publishes goes again alone on a fresh channel (a new connection
if that one went too), and only the one the broker refuses again fails (``refused by
the broker: ...``, retried with backoff); the others are published (those the broker
had taken before the close arrive twice). When no fresh channel can be had, the broker
is away after all: an outage.

A refusal of access (403 ACCESS_REFUSED, on the exchange or on one routing key) and a
nack (a queue full or failed) fail the event as ``unavailable``: it keeps its last attempt
and waits (retried with backoff) instead of filling the dead letter. A refused routing key
is resent past (one by one, as above), so the other types go on. Only when nothing of a
call is confirmed (the exchange refused, every queue full) is it an outage, which ends
with the first confirmed publish, not the first connect. ``publish()`` never raises for
broker trouble; only ``connect()`` raises ``BrokerUnavailableError``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange
from aiormq.exceptions import ChannelAccessRefused, ChannelClosed, ChannelInvalidStateError

from engine.dispatch import ExternalPublishResult
from engine.errors import BrokerUnavailableError, ConfigurationError, OutboxError
from engine.relay import answers
from engine.relay.answers import Outage
from engine.relay.broker import BrokerConnection
from engine.relay.circuit import UNAVAILABLE, Circuit
from engine.relay.cloudevents import DEFAULT_SOURCE_PREFIX, random_span_id
from engine.relay.messages import MessageBuilder
from engine.relay.watching import ConfirmObserver, WatchedSends
from engine.settings import DEFAULT_EXCHANGE
from engine.writing.envelope import EventEnvelope

log = logging.getLogger("engine.relay.rabbitmq")


class RabbitMqOutboxPublisher:
    """Publishes outbox events to a durable topic exchange, routing key = event type.

    ``url``: ``amqp://`` or ``amqps://`` URL. ``exchange``: topic exchange name, declared
    durable on connect. ``source_prefix``: CloudEvents ``source`` prefix
    (``<prefix>/<aggregate_type>``; also the AMQP ``app_id``). ``confirm_timeout``: seconds
    to wait for a publisher confirm before the call counts as an outage. ``connect_timeout``:
    seconds for connecting, opening the channel and declaring the exchange.
    ``probe_interval`` / ``max_probe_interval``: the circuit breaker's first and longest wait
    between probes of a broker found away. ``quiet_driver_logs``: demote aiormq's
    connection-loss ERROR tracebacks to one DEBUG line. ``observer``: told each publish's
    time to its confirm (engine.relay.watching).
    """

    def __init__(
        self,
        url: str,
        *,
        exchange: str = DEFAULT_EXCHANGE,
        source_prefix: str = DEFAULT_SOURCE_PREFIX,
        confirm_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        probe_interval: float = 1.0,
        max_probe_interval: float = 30.0,
        quiet_driver_logs: bool = True,
        new_span_id: Callable[[], str] = random_span_id,
        observer: ConfirmObserver | None = None,
    ) -> None:
        self.observer = observer
        self._broker: BrokerConnection[AbstractExchange] = BrokerConnection(
            url,
            self._declare_exchange,
            connect_timeout=connect_timeout,
            quiet_driver_logs=quiet_driver_logs,
            on_connect=lambda: self._circuit.connected(),
            log=log,
        )
        if not exchange:
            raise ConfigurationError("the RabbitMQ exchange name must not be empty")
        if confirm_timeout <= 0 or connect_timeout <= 0:
            raise ConfigurationError("confirm_timeout and connect_timeout must be > 0")
        self.exchange_name = exchange
        self.confirm_timeout = confirm_timeout
        self._circuit = Circuit(
            self._broker.masked_url,
            probe_interval=probe_interval,
            max_probe_interval=max_probe_interval,
            log=log,
        )
        self._messages = MessageBuilder(source_prefix, new_span_id)
        self._prepared: dict[str, aio_pika.Message] = {}  # messages built ahead, by event id

    @property
    def url(self) -> str:
        return self._broker.url

    @property
    def masked_url(self) -> str:
        return self._broker.masked_url

    @property
    def is_connected(self) -> bool:
        """True when the last known state of the channel is usable."""
        return self._broker.is_open

    @property
    def waiting_since(self) -> datetime | None:
        """When the relay began waiting for the broker (the current outage), or None."""
        return self._circuit.waiting_since

    @property
    def waiting_reason(self) -> str | None:
        """Why the relay is not publishing (the outage's error), or None."""
        return self._circuit.waiting_reason

    async def ready(self) -> bool:
        """Whether a round may claim events for this relay (the circuit breaker).

        True while the broker is up. While it is known to be away: False until the
        next probe is due, then the result of that probe (a connect attempt).
        """
        if not self._circuit.away:
            return True
        if not self._circuit.probe_due():
            return False
        try:
            await self._broker.ensure()
        except BrokerUnavailableError as exc:
            self._circuit.probe_failed(str(exc))
            return False
        return True

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect, open a confirming channel and declare the exchange.

        Raises ``BrokerUnavailableError`` (URL masked) when the broker cannot
        be reached; a no-op when already connected.
        """
        await self._broker.open()

    async def close(self) -> None:
        """Close the connection; ``publish()`` raises until ``connect()`` is called again."""
        await self._broker.close()

    async def prepare(self, envelopes: Sequence[EventEnvelope]) -> None:
        """Build the messages of a batch the next ``publish`` will likely get.

        The dispatcher calls this while it waits for the database, so the next call
        starts sending at once. Kept for that one call only: ``publish`` builds what
        it does not find here, and drops what it did not use.
        """
        self._prepared = await self._messages.build_ahead(envelopes)

    async def publish(self, envelopes: Sequence[EventEnvelope]) -> ExternalPublishResult:
        """Publish and await the confirms; see the module docstring for the outcomes."""
        if self._broker.closed:
            raise OutboxError("the RabbitMQ publisher is closed: call connect() first")
        prepared, self._prepared = self._prepared, {}
        result = ExternalPublishResult()
        firsts = [e for e in envelopes if e.attempt_count <= 1]
        # The first call doubles as the probe of a dead broker: retries with the most
        # attempts left go first, so an outage spends attempts where they are cheapest.
        retries = sorted(
            (e for e in envelopes if e.attempt_count > 1),
            key=lambda e: e.max_attempts - e.attempt_count,
            reverse=True,
        )
        # Once one call went through, the broker is up: the other retries go out together.
        if firsts:
            calls = [firsts] + ([retries] if retries else [])
        else:
            calls = [retries[:1]] + ([retries[1:]] if retries[1:] else [])
        for index, call in enumerate(calls):
            try:
                await self._publish_call(call, result, prepared)
            except Outage as outage:
                error = str(outage)
                for envelope in call:
                    done = envelope.event_id in result.published or (
                        envelope.event_id in result.unattempted
                    )
                    if done:
                        continue
                    if outage.sent:
                        if envelope.event_id not in result.failed:  # not its own failure
                            result.failed[envelope.event_id] = error
                            result.unavailable.add(envelope.event_id)
                    else:  # nothing reached the broker: no attempt spent
                        result.unattempted.add(envelope.event_id)
                left = [e.event_id for rest in calls[index + 1 :] for e in rest]
                result.unattempted.update(left)
                failed = sum(e.event_id in result.failed for e in call)
                self._circuit.report(error, failed, len(result.unattempted), outage.refused)
                break
        else:
            if result.published:
                self._circuit.published()
        return result

    # -- one call -------------------------------------------------------------------------

    async def _publish_call(
        self,
        call: list[EventEnvelope],
        result: ExternalPublishResult,
        prepared: dict[str, aio_pika.Message],
    ) -> None:
        """Publish ``call`` concurrently; raise ``Outage`` if the broker went away.

        An event whose publish never left this process (the channel was closed
        when it got there) goes to ``result.unattempted``, not ``failed``. A publish
        the broker refused (``answers.refused_publish``: a nack, access refused) keeps its
        last attempt, but is an outage only when nothing of the call was confirmed:
        one routing key refused or one queue full must not stop the other types.
        """
        try:
            exchange = await self._broker.ensure()
        except BrokerUnavailableError as exc:
            raise Outage(f"{UNAVAILABLE}: {exc}", sent=False) from None
        outcomes = await self._send_all(exchange, call, prepared)
        if any(isinstance(outcome, ChannelClosed) for outcome in outcomes):
            outcomes = await self._one_by_one(call, outcomes, prepared)
        outage: str | None = None  # an outage of its own: the connection, no confirm
        refusal: str | None = None
        collateral: str | None = None  # taken down by the channel's close over another
        sent = refused = confirmed = False
        for envelope, outcome in zip(call, outcomes, strict=True):
            if outcome is None:
                result.published.add(envelope.event_id)
                sent = confirmed = True
                continue
            error, is_outage = self._describe(outcome, envelope)
            if isinstance(outcome, ChannelInvalidStateError):
                result.unattempted.add(envelope.event_id)  # raised before any frame went out
            else:
                result.failed[envelope.event_id] = error
                if is_outage:
                    result.unavailable.add(envelope.event_id)
                sent = True
            if is_outage and answers.refused_publish(outcome):
                refusal = refusal or error
            elif is_outage and isinstance(outcome, ChannelClosed | ChannelInvalidStateError):
                collateral = collateral or error
            elif is_outage and outage is None:
                outage, refused = error, answers.is_refusal(outcome)
        if outage is None and refusal is not None and not confirmed:
            outage, refused = refusal, True  # refused all alike: the broker's settings
        if outage is None and collateral is not None:
            outage = collateral  # the channel or the connection went, and nothing said why
        if outage is not None:
            self._broker.mark_broken()
            raise Outage(outage, sent=sent, refused=refused)

    async def _send_all(
        self,
        exchange: AbstractExchange,
        call: list[EventEnvelope],
        prepared: dict[str, aio_pika.Message],
    ) -> list[BaseException | None]:
        """Publish every event of ``call`` at once; each one's outcome (None: confirmed).

        One task per publish (aio-pika's own coroutine, no wrapper of ours) and one
        deadline for the call: its publishes start together, so a deadline each would be
        the same instant at the cost of a timer per message (see decisions 0017, 0025).
        """
        outcomes: list[BaseException | None] = [None] * len(call)
        tasks: dict[asyncio.Task[Any], int] = {}
        sends = WatchedSends(self.observer, self._messages, self.exchange_name)
        for index, envelope in enumerate(call):
            try:
                message = sends.message(envelope, prepared)
            except Exception as exc:  # a payload JSON cannot carry (NaN): this event fails
                outcomes[index] = exc
                continue
            publish = exchange.publish(message, routing_key=envelope.event_type, mandatory=True)
            tasks[task := asyncio.ensure_future(publish)] = index
            sends.sent(envelope, task)
        if not tasks:
            return outcomes
        try:
            _done, late = await asyncio.wait(tasks, timeout=self.confirm_timeout)
        except BaseException:  # cancelled: take the publishes down too, as gather would
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            raise
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)
        for task, index in tasks.items():
            outcomes[index] = TimeoutError() if task in late else answers.confirmation_problem(task)
        return outcomes

    async def _one_by_one(
        self,
        call: list[EventEnvelope],
        outcomes: list[BaseException | None],
        prepared: dict[str, aio_pika.Message],
    ) -> list[BaseException | None]:
        """The broker closed the channel over one message of ``call``: send each publish
        the close took down again, alone, on a fresh channel (see the module docstring).

        Which one it was cannot be told from the close: publishes sent before it wait
        for their confirms (written to disk first) and fail with the same error. The
        pass stops at the first sign of an outage (a resend not confirmed in time, a lost
        connection) and after ``confirm_timeout`` in all: what it has not sent keeps the
        close's error, an outage, which spends no event's last attempt.
        """
        isolated = list(outcomes)
        deadline = asyncio.get_running_loop().time() + self.confirm_timeout
        for index, envelope in enumerate(call):
            if not isinstance(outcomes[index], ChannelClosed | ChannelInvalidStateError):
                continue
            if self._broker.closed or asyncio.get_running_loop().time() > deadline:
                break
            try:
                exchange = await self._broker.reopen()
            except BrokerUnavailableError:
                break
            [outcome] = await self._send_all(exchange, [envelope], prepared)
            # Sent alone, it was this one; but access refused is the broker's settings.
            if isinstance(outcome, ChannelClosed) and not isinstance(outcome, ChannelAccessRefused):
                outcome = answers.Refused(self._broker.detail(outcome))
            isolated[index] = outcome
            if outcome is None or not self._describe(outcome, envelope)[1]:
                continue
            if answers.refused_publish(outcome) and "to topic" in str(outcome):
                continue  # topic permissions: this routing key only, not the next
            break  # the broker is away after all, or refuses every publish alike
        return isolated

    async def _declare_exchange(
        self, connection: AbstractConnection
    ) -> tuple[AbstractChannel, AbstractExchange]:
        """A confirming channel on ``connection`` and the durable topic exchange on it."""
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.declare_exchange(
            self.exchange_name, aio_pika.ExchangeType.TOPIC, durable=True
        )
        return channel, exchange

    def _describe(self, exc: BaseException, envelope: EventEnvelope) -> tuple[str, bool]:
        """The error text for a failed publish and whether it means an outage."""
        return answers.describe(
            exc,
            envelope.event_type,
            exchange=self.exchange_name,
            confirm_timeout=self.confirm_timeout,
            detail=self._broker.detail,
        )
