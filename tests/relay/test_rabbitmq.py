"""The RabbitMQ relay against the real broker and the real databases.

Broker tests are marked ``rabbitmq`` and fail (never skip) without OUTBOX_TEST_AMQP_URL; the
outage tests also need OUTBOX_TEST_RMQCTL (``rabbitmqctl`` for that broker).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from types import SimpleNamespace

import pytest
from aiormq.abc import DeliveredMessage
from aiormq.exceptions import PublishError
from pamqp.commands import Basic
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import BackoffPolicy, DispatchResult, EventEnvelope, OutboxDispatcher, OutboxError
from engine.clock import uuid7
from engine.context import TaskContext
from engine.dispatch import ExternalPublishResult
from engine.errors import ConfigurationError
from engine.relay import BrokerUnavailableError, RabbitMqOutboxPublisher, circuit
from engine.relay.cloudevents import rfc3339
from engine.storage.secrets import mask_url
from tests.engine.conftest import rows

from .conftest import TRACE, BrokerControl, Topology, add_events

ONE_SECOND = BackoffPolicy(kind="fixed", base_seconds=1, max_seconds=1, jitter=0)


def closed_port() -> int:
    """A port nothing listens on (an ephemeral one, once freed, may be taken again)."""
    return 1


def envelope(attempt: int = 1, max_attempts: int = 10, event_type: str = "orders.placed"):
    return EventEnvelope(
        event_id=uuid7(),
        tenant_id="acme",
        event_type=event_type,
        event_version=1,
        aggregate_type="order",
        aggregate_id="o-1",
        payload={"order_id": "o-1", "amount": 1},
        created_at=datetime.now(UTC),
        attempt_count=attempt,
        max_attempts=max_attempts,
    )


ACTOR = {"tenant_id": "acme", "actor_id": "u", "request_id": "r"}


def statuses(stored: list[dict[str, object]]) -> Counter[object]:
    return Counter(r["status"] for r in stored)


# -- without a broker ---------------------------------------------------------------------------


def test_configuration_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="amqp://"):
        RabbitMqOutboxPublisher("http://user:pw@host/")
    with pytest.raises(ConfigurationError, match="invalid RabbitMQ URL 'amqp://u:\\*\\*\\*@h:x/'"):
        RabbitMqOutboxPublisher("amqp://u:pw@h:x/")
    with pytest.raises(ConfigurationError, match="confirm_timeout"):
        RabbitMqOutboxPublisher("amqp://h/", confirm_timeout=0)


def test_the_probe_intervals_are_settings(monkeypatch) -> None:
    from engine.settings import load_settings

    assert (load_settings().amqp_probe_seconds, load_settings().amqp_max_probe_seconds) == (1, 30)
    monkeypatch.setenv("OUTBOX_AMQP_PROBE_SECONDS", "0.2")
    monkeypatch.setenv("OUTBOX_AMQP_MAX_PROBE_SECONDS", "0.5")
    assert (load_settings().amqp_probe_seconds, load_settings().amqp_max_probe_seconds) == (
        0.2,
        0.5,
    )
    with pytest.raises(ConfigurationError, match="--amqp-max-probe-seconds must be at least"):
        load_settings(amqp_probe_seconds=1.0)


async def test_connect_to_an_unreachable_broker_raises_a_masked_engine_error(caplog) -> None:
    caplog.set_level(logging.DEBUG)
    port = closed_port()
    publisher = RabbitMqOutboxPublisher(f"amqp://relay:s3cr3t-pw@127.0.0.1:{port}/")
    with pytest.raises(BrokerUnavailableError) as info:
        await publisher.connect()
    assert isinstance(info.value, OutboxError)
    message = str(info.value)
    assert message.startswith(f"cannot reach RabbitMQ at amqp://relay:***@127.0.0.1:{port}/: ")
    assert "Connect call failed" in message
    assert "s3cr3t" not in message and "s3cr3t" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # aiormq noise kept out
    await publisher.close()


async def test_publish_never_raises_for_an_unreachable_broker(caplog) -> None:
    caplog.set_level(logging.DEBUG)
    publisher = RabbitMqOutboxPublisher(f"amqp://relay:s3cr3t-pw@127.0.0.1:{closed_port()}/")
    firsts = [envelope(), envelope()]
    last_try = envelope(attempt=3, max_attempts=3)
    budget = envelope(attempt=2, max_attempts=10)
    result = await publisher.publish([*firsts, last_try, budget])  # never connected: lazy
    # Nothing was sent (the connect failed): every event goes back, no attempt spent.
    assert result.published == set() and result.failed == {}
    assert result.unattempted == {e.event_id for e in [*firsts, last_try, budget]}
    assert publisher.waiting_reason is not None
    assert publisher.waiting_reason.startswith("broker unavailable: cannot reach")

    # Retries only: the same, even for the last try.
    result = await publisher.publish([last_try, budget])
    assert result.failed == {} and result.unattempted == {last_try.event_id, budget.event_id}

    warnings = [r for r in caplog.records if r.name == "engine.relay.rabbitmq"]
    assert [r.levelno for r in warnings if r.levelno >= logging.WARNING] == [logging.WARNING]
    assert "s3cr3t" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    await publisher.close()
    with pytest.raises(OutboxError, match="closed"):
        await publisher.publish(firsts)


class _Exchange:
    """Stands in for a live exchange whose publishes fail as given, per event id."""

    def __init__(self, errors: dict[str, BaseException]) -> None:
        self.errors = errors

    async def publish(self, message, **kwargs):
        raise self.errors[message.message_id]


async def test_a_channel_found_closed_before_the_publish_spends_no_attempt() -> None:
    """ChannelInvalidStateError is raised before any frame is written: nothing was sent."""
    from aiormq.exceptions import ChannelInvalidStateError, ConnectionClosed

    publisher = RabbitMqOutboxPublisher(f"amqp://relay:pw@127.0.0.1:{closed_port()}/")
    first, retry = envelope(), envelope(attempt=2, max_attempts=2)
    exchange = _Exchange({first.event_id: ChannelInvalidStateError("<Channel> closed")})

    async def connected():
        return exchange

    publisher._broker.ensure = connected  # type: ignore[method-assign]
    result = await publisher.publish([first, retry])
    assert result.published == set() and result.failed == {}
    assert result.unattempted == {first.event_id, retry.event_id}  # the retry's last try kept
    assert publisher.waiting_reason is not None
    assert publisher.waiting_reason.startswith("broker unavailable: ")

    # In flight when the connection went: that publish may have reached the broker.
    sent, unsent = envelope(), envelope()
    exchange.errors = {
        sent.event_id: ConnectionClosed(320, "CONNECTION_FORCED"),
        unsent.event_id: ChannelInvalidStateError("<Channel> closed"),
    }
    result = await publisher.publish([sent, unsent])
    assert list(result.failed) == [sent.event_id]
    assert result.failed[sent.event_id].startswith("broker unavailable: ")
    assert result.unattempted == {unsent.event_id}
    await publisher.close()


async def test_an_exchange_refusal_names_the_outage_over_the_publishes_its_close_took_down():
    """The broker refuses one publish (403 on the exchange) and closes the channel; the
    publishes behind it find the channel closed. The refusal, the broker's settings, is
    what the relay waits for, not the closed channel it caused."""
    from aiormq.exceptions import ChannelAccessRefused, ChannelInvalidStateError

    publisher = RabbitMqOutboxPublisher(f"amqp://relay:pw@127.0.0.1:{closed_port()}/")
    refused, *behind = [envelope() for _ in range(3)]
    denied = "ACCESS_REFUSED - access to exchange 'outbox' in vhost '/' refused for user 'u'"
    exchange = _Exchange(
        {
            refused.event_id: ChannelAccessRefused(403, denied),
            **{e.event_id: ChannelInvalidStateError("<Channel> closed") for e in behind},
        }
    )

    async def connected():
        return exchange

    publisher._broker.ensure = connected  # type: ignore[method-assign]
    publisher._broker.reopen = connected  # type: ignore[method-assign]
    result = await publisher.publish([refused, *behind])
    assert result.published == set()
    assert set(result.failed) == {refused.event_id} <= result.unavailable  # keeps its last try
    assert result.unattempted == {e.event_id for e in behind}
    assert "ACCESS_REFUSED" in (publisher.waiting_reason or ""), publisher.waiting_reason
    await publisher.close()


# -- with the broker ----------------------------------------------------------------------------


class Observed:
    """Wraps the relay to look at the rows and the queue the moment its confirms are in."""

    def __init__(self, inner: RabbitMqOutboxPublisher, db: AsyncEngine, topo: Topology) -> None:
        self.inner, self.db, self.topo = inner, db, topo
        self.at_return: tuple[Counter[object], int] | None = None

    async def publish(self, envelopes):
        result = await self.inner.publish(envelopes)
        self.at_return = (statuses(await rows(self.db)), await self.topo.message_count())
        return result


@pytest.mark.rabbitmq
@pytest.mark.parametrize("path", ["clean", "checked"])
async def test_the_message_data_is_the_payload_as_stored(
    db, registry, clock, topology, relay, path, monkeypatch
):
    """A plain-SQL producer's exact numbers (and SQLite's 1e400, valid JSON) arrive as they
    were written: the stored text is sent, not a decode to floats encoded again. Also for
    an event the dispatcher decodes the long way, checking each column (forced here; it
    is how a row the quick look does not clear is read)."""
    await topology.bind()
    stored = (
        '{"tenant_id": "acme", "actor_id": "u", "request_id": "r", '
        '"price": 12345678901234567.89, "rate": 0.1000000000000000055511151231257827}'
    )
    huge = '{"tenant_id": "acme", "actor_id": "u", "request_id": "r", "n": 1e400}'
    exact = uuid7()
    payloads = {exact: stored}
    if db.dialect.name == "sqlite":  # PostgreSQL's json type refuses 1e400 itself
        payloads[uuid7()] = huge
    async with db.begin() as conn:  # the README's plain-SQL INSERT contract
        for event_id, payload in payloads.items():
            await conn.execute(
                text(
                    "INSERT INTO outbox_events (id, tenant_id, event_type, event_version,"
                    " aggregate_type, aggregate_id, payload) VALUES (:id, 'acme',"
                    " 'orders.cancelled', 1, 'order', 'o-1', :payload)"
                ),
                {"id": event_id, "payload": payload},
            )
    dispatcher = OutboxDispatcher(db, registry, clock=clock, external_publisher=relay)
    if path == "checked":
        monkeypatch.setattr(dispatcher.batches.decoder, "_clean_envelope", lambda row: None)
    assert (await dispatcher.dispatch_once()).published == len(payloads)
    received = {m.message_id: m for m in await topology.drain(set(payloads))}
    async with db.connect() as conn:  # what the database holds, read exactly
        column = "payload::text" if db.dialect.name == "postgresql" else "payload"
        held = dict((await conn.execute(text(f"SELECT id, {column} FROM outbox_events"))).all())
    sent = {i: json.loads(received[i].raw_body, parse_float=Decimal)["data"] for i in payloads}
    assert sent == {i: json.loads(held[i], parse_float=Decimal) for i in payloads}
    assert sent[exact]["price"] == Decimal("12345678901234567.89")


async def add_oversized_event(db: AsyncEngine) -> str:
    """An orders.cancelled event of about 8 kB, over a ``limit_message_size(4096)``; its id."""
    big = uuid7()
    async with db.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO outbox_events (id, tenant_id, event_type, event_version,"
                " aggregate_type, aggregate_id, payload) VALUES (:id, 'acme',"
                " 'orders.cancelled', 1, 'order', 'big', :payload)"
            ),
            {"id": big, "payload": json.dumps({**ACTOR, "note": "y" * 8000})},
        )
    return big


@pytest.mark.rabbitmq
async def test_a_message_the_broker_refuses_fails_alone_and_is_no_outage(
    db, registry, clock, topology, broker: BrokerControl, amqp_url
):
    """The broker closes the channel over one message too large for it; the publishes
    the close took down with it go again alone, on one channel, and only that one fails."""
    await topology.bind()
    await broker.limit_message_size(4096)  # read by the channels opened from now on
    channels_before = await broker.open_channels()
    big = await add_oversized_event(db)
    # On their last attempt: a failure would dead-letter them at once.
    normal = await add_events(db, registry, 40, max_attempts=1)
    relay = RabbitMqOutboxPublisher(amqp_url, exchange=topology.exchange)
    dispatcher = OutboxDispatcher(db, registry, clock=clock, external_publisher=relay)
    try:
        await relay.connect()
        result = await dispatcher.dispatch_once()
        assert relay.waiting_reason is None and await relay.ready()  # no outage
        # The resends share a channel: one left open, not one per resend.
        assert await broker.open_channels() - channels_before <= 1
        # The channel it closed is replaced: the next publish goes out at once.
        clock.advance(3600)
        again = await dispatcher.dispatch_once()
    finally:
        await relay.close()
    assert (result.published, result.failed, result.dead_lettered) == (40, 1, 0)
    assert (again.published, again.failed) == (0, 1)  # refused again, still no outage
    stored = {r["id"]: r for r in await rows(db)}
    assert {stored[i]["status"] for i in normal} == {"published"}
    assert stored[big]["status"] == "failed"
    assert stored[big]["last_error"].startswith("refused by the broker: ChannelPreconditionFailed")
    assert "larger than configured max size 4096" in stored[big]["last_error"]
    assert stored[big]["attempt_count"] == 2
    assert set(normal) <= {m.message_id for m in await topology.drain(set(normal))}


async def test_an_events_own_failure_spends_its_attempt_even_beside_an_outage(
    db, registry, clock, monkeypatch
):
    """In one call the broker returns one publish as unroutable (the event's own failure)
    and never confirms the other (the broker is away): only the second keeps its last
    attempt."""
    unroutable, late = await add_events(db, registry, 2, max_attempts=1)

    class Exchange:  # what the broker does with each publish
        async def publish(self, message, routing_key, mandatory):
            if message.message_id == unroutable:
                returned = DeliveredMessage(
                    delivery=Basic.Return(reply_code=312, reply_text="NO_ROUTE"),
                    header=None,
                    body=b"",
                    channel=None,
                )
                raise PublishError(returned, None)
            await asyncio.sleep(3600)  # no confirm comes

    relay = RabbitMqOutboxPublisher("amqp://guest:guest@127.0.0.1:1/", confirm_timeout=0.2)

    async def connected():
        return Exchange()

    monkeypatch.setattr(relay._broker, "ensure", connected)
    dispatcher = OutboxDispatcher(db, registry, clock=clock, external_publisher=relay)
    result = await dispatcher.dispatch_once()
    assert (result.failed, result.dead_lettered) == (1, 1)
    stored = {r["id"]: r for r in await rows(db)}
    assert stored[unroutable]["status"] == "dead_letter"
    assert "unroutable" in stored[unroutable]["dead_letter_reason"]
    assert stored[late]["status"] == "failed" and stored[late]["attempt_count"] == 0
    assert stored[late]["last_error"].startswith("broker unavailable")


@pytest.mark.rabbitmq
async def test_the_one_by_one_resend_stops_when_the_broker_goes_away(
    db, registry, topology, broker: BrokerControl, amqp_url
):
    """A refused message sends the rest again one by one; when a resource alarm starts
    right then, the resend stops at the first publish not confirmed, so the round ends
    well inside the lease and the events wait out the alarm instead of dying."""
    await topology.bind()
    await broker.limit_message_size(4096)
    normal = await add_events(db, registry, 8, max_attempts=1)
    await add_oversized_event(db)
    relay = RabbitMqOutboxPublisher(
        amqp_url, exchange=topology.exchange, confirm_timeout=1, connect_timeout=1
    )
    one_by_one = relay._one_by_one
    ctl_seconds = 0.0  # rabbitmqctl's own time (seconds under load), not the relay's

    async def alarm_first(*args):  # the alarm starts right after the refusing close
        nonlocal ctl_seconds
        ctl_started = time.monotonic()
        await broker.block_publishers()
        ctl_seconds = time.monotonic() - ctl_started
        return await one_by_one(*args)

    relay._one_by_one = alarm_first  # type: ignore[method-assign]
    dispatcher = OutboxDispatcher(db, registry, external_publisher=relay, lease_seconds=30)
    try:
        await relay.connect()
        started = time.monotonic()
        result = await dispatcher.dispatch_once()
        took = time.monotonic() - started - ctl_seconds
    finally:
        await relay.close()
    assert took < 8, result  # 8 resends would take 8 confirm timeouts
    assert result.lost_leases == 0 and result.dead_lettered == 0, result
    await broker.unblock_publishers()
    await broker.limit_message_size(None)
    later = RabbitMqOutboxPublisher(amqp_url, exchange=topology.exchange)
    dispatcher = OutboxDispatcher(db, registry, external_publisher=later, backoff=ONE_SECOND)
    try:
        await later.connect()
        deadline = time.monotonic() + 60
        while statuses(await rows(db)) != Counter({"published": 9}):
            assert time.monotonic() < deadline, statuses(await rows(db))
            await asyncio.sleep(0.2)
            await dispatcher.dispatch_once()
    finally:
        await later.close()
    assert set(normal) <= {m.message_id for m in await topology.drain(set(normal))}


@pytest.mark.rabbitmq
async def test_a_full_queue_that_rejects_publishes_dead_letters_nothing(
    db, registry, clock, topology, amqp_url
):
    """A queue at its x-max-length with x-overflow reject-publish makes the broker nack
    what it cannot take: consumers lagging behind, not the events' fault. The events wait
    and go out as the consumers catch up, instead of filling the dead letter; as the
    broker took the others, the relay is not stopped for it."""
    await topology.bind(queue_arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    events = await add_events(db, registry, 5, max_attempts=1)
    relay = RabbitMqOutboxPublisher(amqp_url, exchange=topology.exchange, probe_interval=0.05)
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, external_publisher=relay, backoff=ONE_SECOND
    )
    try:
        await relay.connect()
        first = await dispatcher.dispatch_once()
        assert (first.published, first.failed, first.dead_lettered) == (2, 3, 0), first
        assert relay.waiting_reason is None
        nacked = [r for r in await rows(db) if r["status"] == "failed"]
        assert all("Basic.Nack" in r["last_error"] for r in nacked), nacked
        deadline = time.monotonic() + 30
        while (published := await _published(db)) != set(events):
            assert time.monotonic() < deadline, statuses(await rows(db))
            await topology.drain(published)  # the consumers catch up
            clock.advance(2)
            await asyncio.sleep(0.2)  # past the probe interval
            assert (await dispatcher.dispatch_once()).dead_lettered == 0
    finally:
        await relay.close()
    assert set(events) <= {m.message_id for m in await topology.drain(set(events))}


async def _published(db: AsyncEngine) -> set[str]:
    return {r["id"] for r in await rows(db) if r["status"] == "published"}


@pytest.mark.rabbitmq
async def test_a_user_the_broker_refuses_to_publish_dead_letters_nothing(
    db, registry, clock, topology, broker: BrokerControl, caplog
):
    """A relay user without write permission on the exchange (a deploy that changed the
    broker's permissions) is refused every publish: that is the broker's configuration,
    not the events'. Nothing is dead-lettered, the relay says what it waits for, and once
    the permission is granted everything goes out."""
    await topology.bind()
    url = await broker.add_user(f"relay-{uuid7()[-12:]}", "s3cret-pw", write="^$")
    events = await add_events(db, registry, 5, max_attempts=1)
    relay = RabbitMqOutboxPublisher(url, exchange=topology.exchange, probe_interval=0.05)
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, external_publisher=relay, backoff=ONE_SECOND
    )
    try:
        await relay.connect()
        with caplog.at_level(logging.WARNING, logger="engine.relay.rabbitmq"):
            for _ in range(3):  # round after round, while the permission is missing
                result = await dispatcher.dispatch_once()
                assert result.dead_lettered == 0, result
                clock.advance(2)
                await asyncio.sleep(0.5)  # past the probe interval
        warned = [r for r in caplog.records if r.name == "engine.relay.rabbitmq"]
        assert len(warned) == 1, [r.getMessage() for r in warned]  # once, not every probe
        assert "ACCESS_REFUSED" in (relay.waiting_reason or ""), relay.waiting_reason
        assert "s3cret-pw" not in (relay.waiting_reason or "")
        stored = await rows(db)
        # Failed with the refusal, or handed back unattempted (sent once the channel was
        # closed): waiting either way.
        assert set(statuses(stored)) <= {"failed", "pending"}, statuses(stored)
        errors = [r["last_error"] for r in stored if r["status"] == "failed"]
        assert errors and all(e.startswith("broker unavailable") for e in errors), errors
        await broker.set_write_permission(url.split("//")[1].split(":")[0], ".*")
        deadline = time.monotonic() + 30
        while statuses(await rows(db)) != Counter({"published": 5}):
            assert time.monotonic() < deadline, statuses(await rows(db))
            clock.advance(2)
            await asyncio.sleep(0.1)
            await dispatcher.dispatch_once()
        assert relay.waiting_reason is None
    finally:
        await relay.close()
    assert set(events) <= {m.message_id for m in await topology.drain(set(events))}


@pytest.mark.rabbitmq
async def test_a_routing_key_the_user_may_not_write_holds_back_only_its_events(
    db, registry, clock, topology, broker: BrokerControl
):
    """Topic permissions let the relay's user write orders.placed only: orders.cancelled is
    refused (403, closing the channel), the other type goes out in the same round, and
    the relay is not stopped. The refused event keeps its last attempt and goes out
    once the permission is granted."""
    await topology.bind()
    name = f"relay-{uuid7()[-12:]}"
    url = await broker.add_user(name, "s3cret-pw", write=".*")
    await broker.set_topic_write_permission(name, topology.exchange, r"^orders\.placed$")
    [refused] = await add_events(db, registry, 1, event_type="orders.cancelled", max_attempts=1)
    placed = await add_events(db, registry, 6, max_attempts=1)
    relay = RabbitMqOutboxPublisher(url, exchange=topology.exchange, probe_interval=0.05)
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, external_publisher=relay, backoff=ONE_SECOND
    )
    try:
        await relay.connect()
        first = await dispatcher.dispatch_once()
        assert (first.published, first.failed, first.dead_lettered) == (6, 1, 0), first
        assert relay.waiting_reason is None and await relay.ready()
        stored = {r["id"]: r for r in await rows(db)}
        assert stored[refused]["status"] == "failed"
        assert "ACCESS_REFUSED" in stored[refused]["last_error"]
        assert "s3cret-pw" not in stored[refused]["last_error"]
        await broker.set_topic_write_permission(name, topology.exchange, ".*")
        clock.advance(2)
        assert (await dispatcher.dispatch_once()).published == 1
    finally:
        await relay.close()
    ids = {refused, *placed}
    assert ids <= {m.message_id for m in await topology.drain(ids)}


@pytest.mark.rabbitmq
async def test_a_broker_that_confirms_nothing_dead_letters_nothing(
    db, registry, clock, topology, broker: BrokerControl, amqp_url, caplog
):
    """Under a resource alarm RabbitMQ takes connections but confirms no publish, so each
    probe lets a call through that times out. Events on their last attempt wait it out."""
    await topology.bind()
    ids = await add_events(db, registry, 3, max_attempts=1)
    relay = RabbitMqOutboxPublisher(
        amqp_url,
        exchange=topology.exchange,
        confirm_timeout=0.3,
        probe_interval=0.05,
        max_probe_interval=0.05,
    )
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, external_publisher=relay, backoff=ONE_SECOND
    )
    rounds = []
    try:
        await relay.connect()
        await broker.block_publishers()
        with caplog.at_level(logging.WARNING, logger="engine.relay.rabbitmq"):
            for _ in range(4):  # four probes let a call through, each on its last attempt
                await asyncio.sleep(0.1)  # the probe is due
                clock.advance(2)  # and the retry
                rounds.append(await dispatcher.dispatch_once())
        warned = [r.getMessage() for r in caplog.records if r.name == "engine.relay.rabbitmq"]
        assert len(warned) == 1, warned  # one outage, however many probes connect
        during = statuses(await rows(db))
        await broker.unblock_publishers()
        deadline = time.monotonic() + 60
        while statuses(await rows(db)) != Counter({"published": 3}):
            assert time.monotonic() < deadline, statuses(await rows(db))
            await asyncio.sleep(0.1)
            clock.advance(2)
            await dispatcher.dispatch_once()
    finally:
        await relay.close()
    assert sum(r.failed for r in rounds) >= 3 and not any(r.dead_lettered for r in rounds)
    assert "dead_letter" not in during
    assert {m.message_id for m in await topology.drain(set(ids))} >= set(ids)


@pytest.mark.rabbitmq
async def test_dispatch_publishes_confirmed_cloudevents(db, registry, clock, topology, relay):
    await topology.bind()
    placed = await add_events(db, registry, 3)
    plain_trace = TaskContext(tenant_id="globex", actor_id="u", request_id="r", trace_id="t-1")
    cancelled = await add_events(
        db, registry, 1, event_type="orders.cancelled", prefix="c", context=plain_trace
    )
    observed = Observed(relay, db, topology)
    dispatcher = OutboxDispatcher(db, registry, clock=clock, external_publisher=observed)

    assert await dispatcher.dispatch_once() == DispatchResult(claimed=4, published=4)
    # When the relay returned, every message was confirmed (already in the durable queue)
    # and no row said published yet: the dispatcher records it only after the confirms.
    assert observed.at_return == (Counter({"publishing": 4}), 4)
    stored = {r["id"]: r for r in await rows(db)}
    assert statuses(list(stored.values())) == Counter({"published": 4})

    received = await topology.drain(set(stored))
    assert sorted(m.message_id for m in received) == sorted(stored)
    for message in received:
        row = stored[message.message_id]
        is_placed = row["id"] in placed
        created = row["created_at"]
        assert isinstance(created, datetime)
        assert message.exchange == topology.exchange
        assert message.routing_key == row["event_type"] == message.type
        assert message.delivery_mode == 2  # persistent
        assert message.content_type == "application/cloudevents+json"
        assert message.app_id == "/shop/order"
        assert message.timestamp.replace(tzinfo=UTC) == created.replace(microsecond=0)
        event = message.body
        traceparent = event.pop("traceparent", None)
        assert event == {
            "specversion": "1.0",
            "id": row["id"],
            "source": "/shop/order",
            "type": row["event_type"],
            "subject": f"order/{row['aggregate_id']}",
            "time": rfc3339(created),
            "datacontenttype": "application/json",
            "tenantid": "acme" if is_placed else "globex",
            "eventversion": 1,
            "aggregatetype": "order",
            "aggregateid": row["aggregate_id"],
            "traceid": TRACE if is_placed else "t-1",
            "data": row["payload"],
        }
        if is_placed:
            assert traceparent is not None
            assert re.fullmatch(rf"00-{TRACE}-[0-9a-f]{{16}}-01", traceparent)
        else:
            assert traceparent is None  # "t-1" is no W3C trace id
    assert {m.message_id for m in received if m.type == "orders.cancelled"} == set(cancelled)


@pytest.mark.rabbitmq
async def test_unroutable_events_fail_and_are_never_published(db, registry, clock, topology, relay):
    await topology.bind("orders.placed")  # nothing is bound for orders.cancelled
    [routed] = await add_events(db, registry, 1)
    [lost] = await add_events(db, registry, 1, event_type="orders.cancelled", prefix="c")
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, external_publisher=relay, backoff=ONE_SECOND
    )
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=2, published=1, failed=1)
    stored = {r["id"]: r for r in await rows(db)}
    assert stored[routed]["status"] == "published"
    assert stored[lost]["status"] == "failed" and stored[lost]["published_at"] is None
    assert stored[lost]["last_error"] == (
        "unroutable: no queue bound for routing key orders.cancelled on exchange "
        f"{topology.exchange} (312 NO_ROUTE)"
    )
    clock.advance(1)  # the retry goes alone, and is still refused
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, failed=1)
    again = {r["id"]: r for r in await rows(db)}[lost]
    assert again["attempt_count"] == 2 and again["last_error"].startswith("unroutable:")
    assert relay.is_connected  # a return is no outage: the channel stays up
    assert [m.message_id for m in await topology.drain({routed})] == [routed]


@pytest.mark.rabbitmq
async def test_broker_outage_mid_run_loses_nothing_and_drains_after_restart(
    db, registry, clock, topology, broker: BrokerControl, relay, caplog
):
    caplog.set_level(logging.INFO)
    await topology.bind()
    ids = await add_events(db, registry, 300, max_attempts=3)
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, batch_size=20, external_publisher=relay, backoff=ONE_SECOND
    )
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=20, published=20)

    # Mid-run: a resource alarm holds the confirms of the next round, and the broker stops
    # while they are outstanding. The round's events fail; none is published or dead.
    await broker.block_publishers()
    in_flight = asyncio.create_task(dispatcher.dispatch_once())
    await asyncio.sleep(0.3)
    assert not in_flight.done(), "the round should be waiting for its confirms"
    await broker.stop()
    assert await in_flight == DispatchResult(claimed=20, failed=20)
    in_flight_errors = {r["last_error"] for r in await rows(db) if r["id"] in ids[20:40]}
    assert all(  # lost on an open connection, e.g. ConnectionClosed 320 CONNECTION_FORCED
        e.startswith("broker unavailable: ") and "cannot reach" not in e for e in in_flight_errors
    ), in_flight_errors

    # Down, and the relay knows it: rounds claim nothing and spend no attempt (the circuit
    # is open; each due probe fails) instead of claiming the backlog and handing it back.
    assert dispatcher.waiting_for is not None
    assert dispatcher.waiting_for.startswith("broker unavailable: ")
    assert relay.waiting_since is not None
    for _ in range(3):
        await asyncio.sleep(0.06)
        clock.advance(1)
        assert await dispatcher.dispatch_once() == DispatchResult()
    stored = await rows(db)
    assert statuses(stored) == Counter({"published": 20, "failed": 20, "pending": 260})
    assert max(int(r["attempt_count"]) for r in stored) == 1  # max_attempts is 3

    await broker.start()
    await broker.unblock_publishers()
    drain = OutboxDispatcher(
        db, registry, clock=clock, batch_size=500, external_publisher=relay, backoff=ONE_SECOND
    )
    deadline = time.monotonic() + 30
    while statuses(await rows(db))["published"] < len(ids):
        assert time.monotonic() < deadline, statuses(await rows(db))
        clock.advance(1)
        assert (await drain.dispatch_once()).dead_lettered == 0
        await asyncio.sleep(0.01)  # the next probe may not be due yet
    assert relay.waiting_reason is None and relay.waiting_since is None

    assert statuses(await rows(db)) == Counter({"published": len(ids)})
    received = await topology.drain(set(ids), wait_seconds=30)
    assert {m.message_id for m in received} == set(ids)  # nothing lost; duplicates allowed
    assert all(m.delivery_mode == 2 for m in received)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # aiormq noise


@pytest.mark.rabbitmq
async def test_a_confirm_timeout_fails_the_call_and_the_relay_recovers(
    amqp_url, topology, broker: BrokerControl
):
    await topology.bind()
    first, retry = envelope(), envelope(attempt=2)
    async with RabbitMqOutboxPublisher(
        amqp_url, exchange=topology.exchange, confirm_timeout=0.5
    ) as relay:
        await broker.block_publishers()  # the broker stops reading: no confirm comes
        started = time.monotonic()
        result = await relay.publish([first, retry])
        assert 0.5 <= time.monotonic() - started < 10
        assert result.failed == {
            first.event_id: "broker unavailable: no publisher confirm within 0.5 s"
        }
        assert result.unattempted == {retry.event_id}
        assert not relay.is_connected

        await broker.unblock_publishers()
        relay.confirm_timeout = 10  # the recovery, not the timeout, is under test now
        result = await relay.publish([first, retry])
        assert result == ExternalPublishResult(published={first.event_id, retry.event_id})
    received = await topology.drain({first.event_id, retry.event_id})
    # The timed-out message may still arrive once the alarm clears: at-least-once.
    assert {m.message_id for m in received} == {first.event_id, retry.event_id}


@pytest.mark.rabbitmq
async def test_an_outage_spends_one_call_and_then_claims_nothing_until_the_broker_returns(
    db, registry, clock, topology, broker: BrokerControl, relay
):
    await topology.bind()
    await broker.stop()
    last_chance = await add_events(db, registry, 4, max_attempts=2, prefix="a")
    roomy = await add_events(db, registry, 2, max_attempts=5, prefix="c")
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, external_publisher=relay, backoff=ONE_SECOND
    )

    # Round 1 finds the outage: the connect fails, nothing was sent, so the call goes back
    # unattempted (no attempt spent) and the circuit opens.
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=6)
    assert dispatcher.waiting_for is not None
    assert dispatcher.waiting_for.startswith(
        f"broker unavailable: cannot reach RabbitMQ at {mask_url(topology.url)}: "
    )
    fresh = await add_events(db, registry, 3, max_attempts=2, prefix="b")
    for _ in range(4):  # later rounds: probes fail, nothing is claimed or spent
        await asyncio.sleep(0.06)
        clock.advance(1)
        assert await dispatcher.dispatch_once() == DispatchResult()
    stored = {r["id"]: r for r in await rows(db)}
    assert [stored[i]["attempt_count"] for i in [*last_chance, *roomy, *fresh]] == [0] * 9
    assert statuses(list(stored.values())) == Counter({"pending": 9})

    await broker.start()
    deadline = time.monotonic() + 30
    published = 0
    while published < 9:  # the next due probe connects; the same relay object publishes
        assert time.monotonic() < deadline
        clock.advance(1)
        published += (await dispatcher.dispatch_once()).published
        await asyncio.sleep(0.05)
    ids = {*last_chance, *roomy, *fresh}
    assert {m.message_id for m in await topology.drain(ids)} == ids


@pytest.mark.rabbitmq
async def test_an_outage_found_before_anything_is_sent_spends_no_attempt(
    db, registry, clock, topology, broker: BrokerControl, relay
):
    """Defect 2 (issue 9): the call that discovers the outage spends no attempt either.

    With one attempt each, a failed call would dead-letter every event; nothing was
    sent (the connect failed), so none is, and the rows stay pending with no attempt
    spent while the circuit is open. Once the broker is back, everything is delivered.
    """
    await topology.bind()
    await broker.stop()
    ids = await add_events(db, registry, 5, max_attempts=1)
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, external_publisher=relay, backoff=ONE_SECOND
    )
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=5)
    assert relay.waiting_reason is not None  # the circuit is open
    for _ in range(3):
        await asyncio.sleep(0.06)
        clock.advance(1)
        assert await dispatcher.dispatch_once() == DispatchResult()
    stored = await rows(db)
    assert statuses(stored) == Counter({"pending": 5})
    assert [r["attempt_count"] for r in stored] == [0] * 5
    assert all(r["last_error"] is None for r in stored)

    await broker.start()
    deadline = time.monotonic() + 30
    total = DispatchResult()
    while total.published < 5:
        assert time.monotonic() < deadline, total
        clock.advance(1)
        total += await dispatcher.dispatch_once()
        await asyncio.sleep(0.05)
    assert total.dead_lettered == 0 and total.failed == 0
    stored = await rows(db)
    assert statuses(stored) == Counter({"published": 5})
    assert [r["attempt_count"] for r in stored] == [1] * 5  # the one publish that was sent
    assert {m.message_id for m in await topology.drain(set(ids))} == set(ids)


async def test_the_circuit_probes_a_broker_found_away_at_a_growing_interval(
    caplog, monkeypatch
) -> None:
    caplog.set_level(logging.DEBUG, logger="engine.relay.rabbitmq")
    now = [1000.0]  # the circuit's clock, moved by hand: a loaded machine cannot skew it
    monkeypatch.setattr(circuit, "time", SimpleNamespace(monotonic=lambda: now[0]))
    publisher = RabbitMqOutboxPublisher(
        f"amqp://relay:pw@127.0.0.1:{closed_port()}/", probe_interval=0.2, max_probe_interval=0.4
    )

    def probes() -> int:
        return sum("probe failed" in r.getMessage() for r in caplog.records)

    assert await publisher.ready()  # nothing known yet: the first round finds out
    await publisher.publish([envelope()])
    assert publisher.waiting_reason is not None and publisher.waiting_since is not None
    assert not await publisher.ready() and probes() == 0  # not due: no connect attempt
    now[0] += 0.19
    assert not await publisher.ready() and probes() == 0  # still not due
    now[0] += 0.02
    assert not await publisher.ready() and probes() == 1  # due: probed, failed
    now[0] += 0.25
    assert not await publisher.ready() and probes() == 1  # next wait doubled to 0.4 s
    now[0] += 0.2
    assert not await publisher.ready() and probes() == 2
    now[0] += 0.41
    assert not await publisher.ready() and probes() == 3  # and stays at the 0.4 s cap
    await publisher.close()


@pytest.mark.rabbitmq
async def test_the_same_publisher_reconnects_after_the_broker_returns(
    topology, broker: BrokerControl, relay, caplog
):
    caplog.set_level(logging.DEBUG)
    await topology.bind()
    before, during, retry = envelope(), envelope(), envelope(attempt=2)
    assert await relay.publish([before]) == ExternalPublishResult(published={before.event_id})

    await broker.stop()
    result = await relay.publish([during, retry])  # does not raise
    # The dead connection is found before anything is sent: both go back unattempted.
    assert result.published == set() and result.failed == {}
    assert result.unattempted == {during.event_id, retry.event_id}
    assert relay.waiting_reason is not None
    assert relay.waiting_reason.startswith("broker unavailable: ")
    assert not relay.is_connected

    await broker.start()
    result = await relay.publish([during, retry])
    assert result == ExternalPublishResult(published={during.event_id, retry.event_id})
    assert relay.is_connected
    ids = {before.event_id, during.event_id, retry.event_id}
    assert ids <= {m.message_id for m in await topology.drain(ids)}

    ours = [r for r in caplog.records if r.name == "engine.relay.rabbitmq"]
    notable = [r for r in ours if r.levelno >= logging.INFO]
    assert [r.levelname for r in notable] == ["WARNING", "INFO"]  # once per outage
    assert notable[0].getMessage().startswith("broker unavailable: ")
    assert notable[1].getMessage().endswith("is back; publishing again")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # aiormq noise


@pytest.mark.rabbitmq
async def test_messages_prepared_ahead_are_sent_once_and_the_unused_dropped(amqp_url, topology):
    await topology.bind()
    sent, unused = envelope(), envelope()
    async with RabbitMqOutboxPublisher(amqp_url, exchange=topology.exchange) as relay:
        await relay.prepare([sent, unused])
        result = await relay.publish([sent])
        assert result == ExternalPublishResult(published={sent.event_id})
        assert relay._prepared == {}  # kept for one call only
        again = await relay.publish([sent])  # built anew when nothing was prepared
        assert again == ExternalPublishResult(published={sent.event_id})
    received = await topology.drain({sent.event_id}, wait_seconds=10)
    assert {m.message_id for m in received} == {sent.event_id}  # the unused one never went out
    assert all(m.delivery_mode == 2 for m in received)
