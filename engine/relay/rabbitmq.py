"""Relay outbox events to RabbitMQ as CloudEvents, with publisher confirms.

Why one module (about 450 lines): connecting, batching with confirms, the outage
rules and the circuit breaker below all read and change one state (the connection,
the channel, the probe schedule, what the relay waits for) inside each
``publish()``; split, that state machine would be shared across modules and its
transitions harder to follow.

``RabbitMqOutboxPublisher`` is the dispatcher's ``external_publisher``. An
event counts as published only once the broker confirmed it (``Basic.Ack``);
an unroutable event (``mandatory``, returned with 312 NO_ROUTE) is *failed*,
never published.

Batching: publishes run concurrently and all confirms are awaited, which is
several times faster than one by one. A round makes at most two calls: the
first attempts together, then the retries together; a round of retries only
sends the retry with the most attempts left alone first. ``confirm_timeout``
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

Circuit breaker: once a call found the broker away, ``ready()`` answers False
until the next probe is due, and the dispatcher claims nothing meanwhile: an
outage spends at most the attempts of the publishes it caught in flight (and never
an event's last: ``ExternalPublishResult.unavailable``), and the
backlog is not claimed and handed back every round. A probe is a connect
attempt, after ``probe_interval`` seconds, doubling after each failed probe up to
``max_probe_interval``; the first probe that connects closes the circuit. A broker
under a resource alarm accepts connections but confirms no publish: each probe then
lets one call through, which times out, and its events spend attempts but never
their last, so they wait out the alarm instead of filling the dead letter.
``waiting_since`` and ``waiting_reason`` say what the relay is waiting for
(heartbeats carry them to ``stats`` and the console).

One message the broker refuses (larger than its ``max_message_size``) closes the whole
channel, and every publish still waiting for its confirm fails with it. That is no
outage: each of those publishes goes again alone on a fresh channel (a new connection
if that one went too), and only the one the broker refuses again fails (``refused by
the broker: ...``, retried with backoff); the others are published (those the broker
had taken before the close arrive twice). When no fresh channel can be had, the broker
is away after all: an outage.

A refusal of access (403 ACCESS_REFUSED: the user may not write to the exchange, or to
that routing key under topic permissions) and a nack (which RabbitMQ sends only when a
queue cannot take the message, at its ``x-max-length`` with ``x-overflow:
reject-publish`` as consumers lag behind, or when a queue process failed) are the
broker's settings or state, not the event's: such an event fails as ``unavailable``,
so it keeps its last attempt and waits (retried with backoff) instead of filling the
dead letter. A refused routing key is resent past (one by one, as above), so the other
types go on. Only when nothing of a call is confirmed (the exchange refused, every
queue full) is it an outage. Then, as under a resource alarm, each probe connects
(only the publish is not taken), so such an outage ends with the first confirmed
publish, not the first connect, and its probe interval grows as for a broker that is
down; it is warned of once.

Reconnecting is done here, not by ``connect_robust``: a robust channel does not
wait for the reconnection and failed publishes are not replayed, so every
``publish()`` simply checks the connection first and reconnects when it broke
(the dispatcher's rounds pace the attempts). ``publish()`` never raises for
broker trouble; only ``connect()`` raises ``BrokerUnavailableError``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange
from aio_pika.connection import Connection, make_url
from aiormq.abc import DeliveredMessage
from aiormq.exceptions import (
    AMQPError,
    ChannelAccessRefused,
    ChannelClosed,
    ChannelInvalidStateError,
    DeliveryError,
    PublishError,
)
from pamqp.commands import Basic

from engine.clock import utc_now
from engine.dispatch import ExternalPublishResult
from engine.errors import BrokerUnavailableError, ConfigurationError, OutboxError
from engine.relay.cloudevents import (
    CONTENT_TYPE,
    DEFAULT_SOURCE_PREFIX,
    encode_cloudevent,
    random_span_id,
    to_cloudevent,
)
from engine.settings import DEFAULT_EXCHANGE
from engine.storage.database import mask_secrets, mask_url
from engine.writing.envelope import EventEnvelope

log = logging.getLogger("engine.relay.rabbitmq")

UNAVAILABLE = "broker unavailable"
# prepare() yields to the event loop after this many messages built.
_PREPARE_CHUNK = 50


class _Outage(Exception):
    """Internal: the broker went away during a call (carries the error text).

    ``sent``: whether any publish of the call may have reached the broker; when
    False (the connect failed), the whole call goes back unattempted. ``refused``:
    the broker is up but refuses this relay's publishes (access refused).
    """

    def __init__(self, error: str, *, sent: bool, refused: bool = False) -> None:
        super().__init__(error)
        self.sent = sent
        self.refused = refused


class _NotConfirmed(Exception):
    """Internal: the broker answered a publish with something other than an ack."""


class _Refused(Exception):
    """Internal: the broker closed the channel over this one message (sent alone)."""


class RabbitMqOutboxPublisher:
    """Publishes outbox events to a durable topic exchange, routing key = event type.

    ``url``: ``amqp://`` or ``amqps://`` URL. ``exchange``: topic exchange name,
    declared durable on connect. ``source_prefix``: CloudEvents ``source`` prefix
    (``<prefix>/<aggregate_type>``; also the AMQP ``app_id``). ``confirm_timeout``:
    seconds to wait for a publisher confirm before the call counts as an outage.
    ``connect_timeout``: seconds for connecting, opening the channel and declaring
    the exchange. ``probe_interval`` / ``max_probe_interval``: the circuit breaker's
    first and longest wait between probes of a broker found away. ``quiet_driver_logs``:
    demote aiormq's connection-loss ERROR tracebacks to one DEBUG line on this module's
    logger.
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
    ) -> None:
        if not url.startswith(("amqp://", "amqps://")):
            # Not echoed: without its scheme (user:pw@host) no mask finds the password.
            scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", url)
            got = f"scheme {scheme.group(1)!r}" if scheme else "no scheme"
            raise ConfigurationError(
                f"RabbitMQ URL must start with amqp:// or amqps:// (it has {got})"
            )
        if not exchange:
            raise ConfigurationError("the RabbitMQ exchange name must not be empty")
        try:
            _ = make_url(url).port  # parsed now: a bad URL is a configuration error, not an outage
        except ValueError as exc:
            raise ConfigurationError(f"invalid RabbitMQ URL {mask_url(url)!r}: {exc}") from None
        if confirm_timeout <= 0 or connect_timeout <= 0:
            raise ConfigurationError("confirm_timeout and connect_timeout must be > 0")
        if not 0 <= probe_interval <= max_probe_interval:
            raise ConfigurationError("probe intervals must satisfy 0 <= probe <= max probe")
        self.url = url
        self.exchange_name = exchange
        self.source_prefix = source_prefix
        self.confirm_timeout = confirm_timeout
        self.connect_timeout = connect_timeout
        self._new_span_id = new_span_id
        self._quiet = quiet_driver_logs
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._broken = False
        self._closed = False
        self._outage: str | None = None  # set while the broker is known to be away
        # The broker, reachable, takes no publish (``_refusal``): only a confirmed publish
        # ends such an outage, not a connect.
        self._refusing = False
        self.probe_interval = probe_interval
        self.max_probe_interval = max_probe_interval
        self._probe_delay = probe_interval
        self._next_probe = 0.0  # time.monotonic() of the next probe while away
        self.waiting_since: datetime | None = None
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()
        self._prepared: dict[str, aio_pika.Message] = {}  # messages built ahead, by event id

    @property
    def masked_url(self) -> str:
        return mask_url(self.url)

    @property
    def is_connected(self) -> bool:
        """True when the last known state of the channel is usable."""
        return self._exchange is not None and not self._broken and not self._channel_closed()

    @property
    def waiting_reason(self) -> str | None:
        """Why the relay is not publishing (the outage's error), or None."""
        return self._outage

    async def ready(self) -> bool:
        """Whether a round may claim events for this relay (the circuit breaker).

        True while the broker is up. While it is known to be away: False until the
        next probe is due, then the result of that probe (a connect attempt).
        """
        if self._outage is None:
            return True
        if time.monotonic() < self._next_probe:
            return False
        try:
            async with self._lock:
                await self._ensure_connected()
        except BrokerUnavailableError as exc:
            self._probe_delay = min(
                max(self._probe_delay * 2, self.probe_interval), self.max_probe_interval
            )
            self._next_probe = time.monotonic() + self._probe_delay
            self._outage = f"{UNAVAILABLE}: {exc}"
            log.debug("probe failed; next probe in %.3g s: %s", self._probe_delay, exc)
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
        self._closed = False
        async with self._lock:
            await self._ensure_connected()

    async def close(self) -> None:
        """Close the connection; ``publish()`` raises until ``connect()`` is called again."""
        self._closed = True
        async with self._lock:
            await self._drop_connection(wait=True)
        if self._closing:
            await asyncio.gather(*self._closing)

    async def prepare(self, envelopes: Sequence[EventEnvelope]) -> None:
        """Build the messages of a batch the next ``publish`` will likely get.

        The dispatcher calls this while it waits for the database, so the next call
        starts sending at once. Kept for that one call only: ``publish`` builds what
        it does not find here, and drops what it did not use.
        """
        prepared: dict[str, aio_pika.Message] = {}
        for index, envelope in enumerate(envelopes, 1):
            try:
                prepared[envelope.event_id] = self._message(envelope)
            except Exception:  # publish builds it again and reports the error
                continue
            if index % _PREPARE_CHUNK == 0:
                await asyncio.sleep(0)  # let the database round trip go out meanwhile
        self._prepared = prepared

    async def publish(self, envelopes: Sequence[EventEnvelope]) -> ExternalPublishResult:
        """Publish and await the confirms; see the module docstring for the outcomes."""
        if self._closed:
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
            except _Outage as outage:
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
                self._report_outage(error, failed, len(result.unattempted), outage.refused)
                break
        else:
            if self._refusing and result.published:
                self._end_outage()
        return result

    # -- one call -------------------------------------------------------------------------

    async def _publish_call(
        self,
        call: list[EventEnvelope],
        result: ExternalPublishResult,
        prepared: dict[str, aio_pika.Message],
    ) -> None:
        """Publish ``call`` concurrently; raise ``_Outage`` if the broker went away.

        An event whose publish never left this process (the channel was closed
        when it got there) goes to ``result.unattempted``, not ``failed``. A publish
        the broker refused (``_refused_publish``: a nack, access refused) keeps its
        last attempt, but is an outage only when nothing of the call was confirmed:
        one routing key refused or one queue full must not stop the other types.
        """
        try:
            async with self._lock:
                exchange = await self._ensure_connected()
        except BrokerUnavailableError as exc:
            raise _Outage(f"{UNAVAILABLE}: {exc}", sent=False) from None
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
            if is_outage and _refused_publish(outcome):
                refusal = refusal or error
            elif is_outage and isinstance(outcome, ChannelClosed | ChannelInvalidStateError):
                collateral = collateral or error
            elif is_outage and outage is None:
                outage, refused = error, _refusal(outcome)
        if outage is None and refusal is not None and not confirmed:
            outage, refused = refusal, True  # refused all alike: the broker's settings
        if outage is None and collateral is not None:
            outage = collateral  # the channel or the connection went, and nothing said why
        if outage is not None:
            self._broken = True
            raise _Outage(outage, sent=sent, refused=refused)

    async def _send_all(
        self,
        exchange: AbstractExchange,
        call: list[EventEnvelope],
        prepared: dict[str, aio_pika.Message],
    ) -> list[BaseException | None]:
        """Publish every event of ``call`` at once; each one's outcome (None: confirmed).

        One task per publish (aio-pika's own coroutine, no wrapper of ours) and one
        deadline for the call: every publish of a call starts together, so a deadline
        each would be the same instant at the cost of a timer per message.
        """
        outcomes: list[BaseException | None] = [None] * len(call)
        tasks: dict[asyncio.Task[Any], int] = {}
        for index, envelope in enumerate(call):
            try:
                message = prepared.pop(envelope.event_id, None) or self._message(envelope)
            except Exception as exc:  # a payload JSON cannot carry (NaN): this event fails
                outcomes[index] = exc
                continue
            publish = exchange.publish(message, routing_key=envelope.event_type, mandatory=True)
            tasks[asyncio.ensure_future(publish)] = index
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
            outcomes[index] = TimeoutError() if task in late else self._confirmation_problem(task)
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
            if self._closed or asyncio.get_running_loop().time() > deadline:
                break
            try:
                async with self._lock:
                    exchange = await self._open_channel()
            except BrokerUnavailableError:
                break
            [outcome] = await self._send_all(exchange, [envelope], prepared)
            # Sent alone, it was this one; but access refused is the broker's settings.
            if isinstance(outcome, ChannelClosed) and not isinstance(outcome, ChannelAccessRefused):
                outcome = _Refused(self._detail(outcome))
            isolated[index] = outcome
            if outcome is None or not self._describe(outcome, envelope)[1]:
                continue
            if _refused_publish(outcome) and "to topic" in str(outcome):
                continue  # topic permissions: this routing key only, not the next
            break  # the broker is away after all, or refuses every publish alike
        return isolated

    async def _open_channel(self) -> AbstractExchange:
        """The relay's channel while it is open, else a fresh one (caller holds the lock)."""
        if self._closed:
            raise BrokerUnavailableError("the relay is closed")
        if self._exchange is not None and not self._broken and not self._channel_closed():
            return self._exchange
        return await self._fresh_channel()

    async def _fresh_channel(self) -> AbstractExchange:
        """A new confirming channel, on the open connection when it can be had there, else
        on a new connection (caller holds the lock).

        Publish frames already queued behind the refused one reach the broker after the
        channel's close, and the broker may then end the whole connection for them
        (``CHANNEL_ERROR - expected 'channel.open'``): that is no outage either.
        """
        connection = self._connection
        if connection is None or connection.is_closed:
            self._broken = True
            return await self._ensure_connected()
        try:
            async with asyncio.timeout(self.connect_timeout):
                channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
                exchange = await channel.declare_exchange(
                    self.exchange_name, aio_pika.ExchangeType.TOPIC, durable=True
                )
        except Exception as exc:
            log.debug("a fresh channel failed (%s); connecting again", self._detail(exc))
            self._broken = True
            return await self._ensure_connected()
        channel.close_callbacks.add(self._on_channel_closed)
        self._channel, self._exchange, self._broken = channel, exchange, False
        return exchange

    def _message(self, envelope: EventEnvelope) -> aio_pika.Message:
        """The persistent AMQP message of one event; its body is encoded once, here."""
        raw = envelope.raw_payload  # sent as stored, not decoded and encoded again
        event = to_cloudevent(
            envelope,
            source_prefix=self.source_prefix,
            new_span_id=self._new_span_id,
            data=raw is None,
        )
        return aio_pika.Message(
            encode_cloudevent(event, raw),
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=envelope.event_id,
            content_type=CONTENT_TYPE,
            timestamp=envelope.created_at,
            type=envelope.event_type,
            app_id=event["source"],
        )

    @staticmethod
    def _confirmation_problem(task: asyncio.Task[Any]) -> BaseException | None:
        """None when the broker acked the publish; otherwise what went wrong."""
        if task.cancelled():
            return asyncio.CancelledError()
        exc = task.exception()
        if exc is not None:
            return exc
        confirmation = task.result()
        if isinstance(confirmation, DeliveredMessage):  # returned although on_return_raises
            return PublishError(confirmation, confirmation.delivery)
        if not isinstance(confirmation, Basic.Ack):
            return _NotConfirmed(f"not confirmed by the broker ({confirmation!r})")
        return None

    def _describe(self, exc: BaseException, envelope: EventEnvelope) -> tuple[str, bool]:
        """The error text for a failed publish and whether it means an outage."""
        if isinstance(exc, PublishError):
            delivery = exc.message.delivery if exc.message is not None else None
            code = getattr(delivery, "reply_code", 312)
            text = getattr(delivery, "reply_text", "NO_ROUTE")
            return (
                f"unroutable: no queue bound for routing key {envelope.event_type} on "
                f"exchange {self.exchange_name} ({code} {text})",
                False,
            )
        if isinstance(exc, DeliveryError):  # a nack: the broker's state, not the message's
            frame = getattr(exc.frame, "name", type(exc.frame).__name__)
            return (
                f"{UNAVAILABLE}: the broker rejected the publish ({frame}): a queue at its "
                "x-max-length with x-overflow reject-publish, or a queue that failed",
                True,
            )
        if isinstance(exc, _NotConfirmed):
            return str(exc), False
        if isinstance(exc, _Refused):
            return f"refused by the broker: {exc}", False
        if isinstance(exc, TimeoutError):
            return (
                f"{UNAVAILABLE}: no publisher confirm within {self.confirm_timeout:g} s",
                True,
            )
        if isinstance(exc, AMQPError | ChannelInvalidStateError | OSError | asyncio.CancelledError):
            return f"{UNAVAILABLE}: {self._detail(exc)}", True
        return f"cannot publish: {self._detail(exc)}", False

    # -- connection -------------------------------------------------------------------------

    async def _ensure_connected(self) -> AbstractExchange:
        """The live exchange, reconnecting when the connection broke (caller holds the lock)."""
        if self._exchange is not None and not self._broken and not self._channel_closed():
            return self._exchange
        await self._drop_connection(wait=False)
        if self._quiet:
            _quiet_driver_logs()
        # Built by hand rather than with aio_pika.connect(), so that a failed attempt can be
        # closed here (otherwise its __del__ leaves an un-awaited close() coroutine behind).
        connection: AbstractConnection = Connection(make_url(self.url))
        try:
            async with asyncio.timeout(self.connect_timeout):
                await connection.connect(timeout=self.connect_timeout)
                channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
                exchange = await channel.declare_exchange(
                    self.exchange_name, aio_pika.ExchangeType.TOPIC, durable=True
                )
        except Exception as exc:  # any failure here means "not connected", never a crash
            await _close_quietly(connection)
            raise BrokerUnavailableError(
                f"cannot reach RabbitMQ at {self.masked_url}: {self._detail(exc)}"
            ) from None
        connection.close_callbacks.add(self._on_connection_closed)
        channel.close_callbacks.add(self._on_channel_closed)
        self._connection, self._channel, self._exchange = connection, channel, exchange
        self._broken = False
        if self._refusing:  # connecting was never the trouble
            log.debug("connected to RabbitMQ at %s again; it took no publish last", self.masked_url)
        elif self._outage is not None:
            self._end_outage()
        else:
            log.debug("connected to RabbitMQ at %s", self.masked_url)
        return exchange

    async def _drop_connection(self, *, wait: bool) -> None:
        """Forget the connection and close it; in the background unless ``wait``.

        A broken connection can take long to close (a broker that stopped reading
        under a resource alarm), which must not delay the reconnect.
        """
        connection = self._connection
        self._connection = self._channel = self._exchange = None
        self._broken = False
        if connection is None:
            return
        connection.close_callbacks.discard(self._on_connection_closed)
        if wait:
            await _close_quietly(connection)
        else:
            task = asyncio.create_task(_close_quietly(connection))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _channel_closed(self) -> bool:
        return self._channel is None or self._channel.is_closed

    def _on_connection_closed(self, sender: Any, exc: BaseException | None = None) -> None:
        if sender is self._connection:
            self._broken = True

    def _on_channel_closed(self, sender: Any, exc: BaseException | None = None) -> None:
        if sender is self._channel:
            self._broken = True

    def _end_outage(self) -> None:
        log.info("RabbitMQ at %s is back; publishing again", self.masked_url)
        self._outage, self._refusing = None, False
        self.waiting_since = None
        self._probe_delay = self.probe_interval

    def _detail(self, exc: BaseException) -> str:
        text = str(exc).strip() or repr(exc)
        return mask_secrets(f"{type(exc).__name__}: {text}", self.url)

    def _report_outage(self, error: str, failed: int, left: int, refused: bool = False) -> None:
        """Warn once per outage (the dispatcher may retry every second); then DEBUG.

        A refusal (``_refusal``) recurs at each probe, as every probe connects: the
        interval grows as for a broker that cannot be reached.
        """
        level = logging.DEBUG if self._outage is not None else logging.WARNING
        if self._outage is None:
            self.waiting_since = utc_now()
        elif refused and self._refusing:
            self._probe_delay = min(
                max(self._probe_delay * 2, self.probe_interval), self.max_probe_interval
            )
        self._outage, self._refusing = error, refused
        self._next_probe = time.monotonic() + self._probe_delay
        log.log(
            level,
            "%s; %d event(s) failed (retried with backoff), %d handed back unattempted "
            "(no attempt spent)",
            error,
            failed,
            left,
        )


def _refused_publish(exc: BaseException) -> bool:
    """A publish the broker, up and taking others, may refuse alone: a nack (its queue is
    full) or access refused (its routing key, under topic permissions)."""
    nacked = isinstance(exc, DeliveryError) and not isinstance(exc, PublishError)
    return nacked or isinstance(exc, ChannelAccessRefused)


def _refusal(exc: BaseException) -> bool:
    """Whether the broker, reachable, did not take the publish: access refused, a nack,
    or no confirm in time (a resource alarm). Every probe may connect then, so such an
    outage ends with a confirmed publish."""
    return _refused_publish(exc) or isinstance(exc, TimeoutError)


async def _close_quietly(connection: AbstractConnection) -> None:
    """Close a connection that may already be dead, without raising."""
    try:
        async with asyncio.timeout(2.0):
            await connection.close()
    except Exception as exc:  # best effort: the connection is being thrown away
        log.debug("closing the RabbitMQ connection: %s", type(exc).__name__)


_DRIVER_NOISE = (
    "Unexpected connection close from remote",
    "Cancelling cause reader exited abnormally",
    "error when creating transport",
)


class _DriverNoiseFilter(logging.Filter):
    """Turns aiormq's connection-loss ERROR tracebacks into one DEBUG line of ours.

    The relay already reports an outage once, as a WARNING with the failed and
    handed-back counts; aiormq's tracebacks repeat that on every reconnect try.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        if not any(marker in message for marker in _DRIVER_NOISE):
            return True
        log.debug("aiormq: %s", mask_secrets(message.splitlines()[0]))
        return False


_NOISE_FILTER = _DriverNoiseFilter()


def _quiet_driver_logs() -> None:
    logger = logging.getLogger("aiormq.connection")
    if _NOISE_FILTER not in logger.filters:
        logger.addFilter(_NOISE_FILTER)
