"""The inbox consumer on the real broker and both databases: modes, dedup, bad messages,
acks after commits, heartbeats."""

from __future__ import annotations

import asyncio
import json

import aio_pika
import pytest

from engine.errors import ConfigurationError, InstalledAppError
from engine.inbox.consumer import InboxConsumer
from engine.inbox.writer import InboxWriter, WriteResult
from engine.operating.insights import OutboxInsights
from engine.storage.schema import outbox_events as t
from tests.inbox.conftest import (
    FAST,
    Inbound,
    count,
    events,
    eventually,
    inbound_rows,
    running,
    structured,
)
from tests.inbox.corpus import MALFORMED, SOURCE, TRACEPARENT, TYPE, binary_headers, event

pytestmark = [pytest.mark.rabbitmq, pytest.mark.all_drivers]


async def test_structured_and_binary_messages_become_pending_rows(db, registry, inbound):
    binary = aio_pika.Message(
        json.dumps({"order_id": "b-1", "amount": 5}).encode(),
        content_type="application/json",
        headers=binary_headers(
            "bin-1", **{"ce-partitionkey": "order:b-1", "ce-traceparent": TRACEPARENT}
        ),
    )
    async with running(db, registry, inbound.settings(), inbound.url) as run:
        await eventually(lambda: _declared(inbound), "the consumer to declare its queue")
        await inbound.publish(event("str-1", partitionkey="order:s-1"), binary)
        await eventually(lambda: _stored(db, 2), "both rows")
        summary = await run.stop()
    assert (summary.totals.received, summary.totals.stored, summary.totals.acked) == (2, 2, 2)
    rows = {r["inbound_id"]: r for r in await inbound_rows(db)}
    assert rows["str-1"]["ordering_key"] == "order:s-1"
    assert rows["str-1"]["payload"]["order_id"] == "str-1"
    assert rows["bin-1"]["payload"] == {
        "order_id": "b-1",
        "amount": 5,
        "tenant_id": "acme",
        "actor_id": SOURCE,
        "request_id": "bin-1",
    }
    assert rows["bin-1"]["ordering_key"] == "order:b-1"
    assert rows["bin-1"]["traceparent"] == TRACEPARENT
    for row in rows.values():
        assert row["status"] == "pending" and row["event_type"] == TYPE
        assert (row["inbound_source"], row["inbound_queue"]) == (SOURCE, inbound.queue)
        assert row["id"] != row["inbound_id"]
    assert await inbound.ready() == 0


async def test_a_message_delivered_twice_is_stored_once(db, registry, inbound):
    await inbound.declare()
    await inbound.publish(*events("twice", 5), *events("twice", 5))
    async with running(db, registry, inbound.settings(), inbound.url) as run:
        await eventually(lambda: _acked(run, 10), "ten acks")
        summary = await run.stop()
    assert summary.totals.stored == 5 and summary.totals.duplicates == 5
    assert await count(db) == 5
    assert await inbound.ready() == 0


async def test_bad_messages_are_stored_dead_lettered_and_the_good_ones_around_them_delivered(
    db, registry, inbound
):
    """The malformed corpus, each message between two good ones: nothing requeued,
    nothing dropped, the consumer alive throughout."""
    await inbound.declare()
    sent: list[aio_pika.Message] = []
    for n, case in enumerate(MALFORMED):
        sent.append(structured(event(f"before-{n}")))
        sent.append(
            aio_pika.Message(
                case.body, content_type=case.content_type, headers=case.headers or None
            )
        )
    sent.append(structured(event("last")))
    await inbound.publish(*sent)
    settings = inbound.settings(max_message_bytes=4096)
    async with running(db, registry, settings, inbound.url) as run:
        await eventually(lambda: _acked(run, len(sent)), "every message acked")
        assert not run.task.done()
        summary = await run.stop()
    rows = await inbound_rows(db)
    assert len(rows) == len(sent)
    good = [r for r in rows if r["status"] == "pending" and r["event_type"] == TYPE]
    assert {r["inbound_id"] for r in good} == {f"before-{n}" for n in range(len(MALFORMED))} | {
        "last"
    }
    bad = [r for r in rows if r not in good]
    assert len(bad) == len(MALFORMED)
    for case, row in zip(MALFORMED, bad, strict=True):  # in the order they were sent
        if case.outcome == "unknown_type":
            assert row["status"] == "pending" and row["event_type"] == "billing.unheard_of"
            continue
        assert row["status"] == "dead_letter", case.name
        assert case.reason in row["dead_letter_reason"], (case.name, row["dead_letter_reason"])
        assert bytes(row["inbound_body"]) == case.body, case.name
        assert row["inbound_queue"] == inbound.queue
    dead = sum(1 for case in MALFORMED if case.outcome == "dead_letter")
    assert summary.totals.rejected == dead
    assert summary.totals.unknown_types == 1
    assert await inbound.ready() == 0


async def test_nothing_is_acked_before_its_batch_commits(db, registry, inbound):
    """While the batch cannot be committed the consumer holds it unacked; a crash then
    hands every message back to the queue, and the next consumer stores each once."""
    await inbound.declare()
    await inbound.publish(*events("held", 6))
    blocked = asyncio.Event()

    class Refusing(InboxWriter):
        async def write(self, rows):  # type: ignore[no-untyped-def]
            blocked.set()
            raise OSError("the database is away")

    consumer = InboxConsumer(
        db, registry, inbound.settings(), amqp_url=inbound.url, options=FAST, instance_id="c-1"
    )
    consumer.writer = Refusing(db)
    async with running(db, registry, inbound.settings(), inbound.url, consumer=consumer) as run:
        await asyncio.wait_for(blocked.wait(), 30)
        await asyncio.sleep(0.5)  # several tries of the same batch
        assert await inbound.ready() == 0  # held by the consumer, not acked
        assert run.consumer.waiting_for and run.consumer.waiting_for.startswith(
            "database unavailable: "
        )
        assert run.consumer.totals.storage_errors >= 2 and run.consumer.totals.acked == 0
        await run.crash()
    assert await count(db) == 0
    await eventually(lambda: _ready_is(inbound, 6), "the six messages back in the queue")
    async with running(db, registry, inbound.settings(), inbound.url, instance_id="c-2") as run:
        await eventually(lambda: _acked(run, 6), "six acks")
    assert await count(db) == 6


async def test_a_crash_between_commit_and_ack_redelivers_and_each_event_stays_one_row(
    db, registry, inbound
):
    await inbound.declare()
    await inbound.publish(*events("crash", 8))
    committed = asyncio.Event()

    class CommitThenDie(InboxWriter):
        async def write(self, rows):  # type: ignore[no-untyped-def]
            result: WriteResult = await super().write(rows)
            committed.set()
            await asyncio.Event().wait()  # never returns: the process dies here
            return result

    consumer = InboxConsumer(
        db, registry, inbound.settings(), amqp_url=inbound.url, options=FAST, instance_id="c-1"
    )
    consumer.writer = CommitThenDie(db)
    async with running(db, registry, inbound.settings(), inbound.url, consumer=consumer) as run:
        await asyncio.wait_for(committed.wait(), 30)
        stored = await count(db)
        assert stored >= 1
        await run.crash()
    await eventually(lambda: _ready_is(inbound, 8), "the unacked messages back in the queue")
    async with running(db, registry, inbound.settings(), inbound.url, instance_id="c-2") as run:
        await eventually(lambda: _acked(run, 8), "eight acks")
        summary = await run.stop()
    assert summary.totals.duplicates == stored
    assert await count(db) == 8
    assert await count(db, t.c.inbound_id == "crash-0") == 1


async def test_a_stop_with_a_batch_waiting_for_the_database_leaves_it_unacked(
    db, registry, inbound
):
    await inbound.declare()
    await inbound.publish(*events("stop", 4))
    tried = asyncio.Event()

    class Refusing(InboxWriter):
        async def write(self, rows):  # type: ignore[no-untyped-def]
            tried.set()
            raise OSError("the database is away")

    consumer = InboxConsumer(
        db, registry, inbound.settings(), amqp_url=inbound.url, options=FAST, instance_id="c-1"
    )
    consumer.writer = Refusing(db)
    async with running(db, registry, inbound.settings(), inbound.url, consumer=consumer) as run:
        await asyncio.wait_for(tried.wait(), 30)
        summary = await run.stop(seconds=10)
    assert summary.shutdown_requested and summary.totals.acked == 0
    await eventually(lambda: _ready_is(inbound, 4), "the batch back in the queue, whole")


async def test_the_heartbeat_says_consumer_queue_and_totals(db, registry, inbound):
    await inbound.declare()
    await inbound.publish(*events("beat", 3), *events("beat", 1))
    async with running(db, registry, inbound.settings(), inbound.url, instance_id="inbox-7") as run:
        await eventually(lambda: _acked(run, 4), "four acks")
        await asyncio.sleep(0.3)  # the next heartbeat

        async def beat_shows_it() -> bool:
            beats = await OutboxInsights(db).heartbeats()
            mine = [b for b in beats if b.instance_id == "inbox-7"]
            return bool(mine) and mine[0].details["totals"]["acked"] == 4

        await eventually(beat_shows_it, "the heartbeat to carry the totals")
        [beat] = [b for b in await OutboxInsights(db).heartbeats() if b.instance_id == "inbox-7"]
        assert beat.kind == "consumer" and beat.state == "alive"
        assert beat.details["queue"] == inbound.queue
        assert beat.details["bindings"] == [inbound.binding]
        totals = beat.details["totals"]
        assert (totals["received"], totals["stored"], totals["duplicates"]) == (4, 3, 1)
        assert beat.details["waiting_for"] is None
    [beat] = [b for b in await OutboxInsights(db).heartbeats() if b.instance_id == "inbox-7"]
    assert beat.state == "stopped"


async def test_a_queue_declared_with_other_arguments_is_refused_in_one_line(db, registry, inbound):
    await inbound.declare(**{"x-max-length": 10})
    consumer = InboxConsumer(
        db, registry, inbound.settings(), amqp_url=inbound.url, options=FAST, instance_id="c-1"
    )
    with pytest.raises(ConfigurationError, match="refused the queue") as caught:
        await consumer.run(asyncio.Event())
    assert "\n" not in str(caught.value) and "guest:guest" not in str(caught.value)


# -- helpers ---------------------------------------------------------------------------------


async def _declared(inbound: Inbound) -> bool:
    try:
        await inbound.ready()
    except Exception:
        return False
    return True


async def _stored(db, n: int) -> bool:
    return await count(db) >= n


async def _acked(run, n: int) -> bool:  # type: ignore[no-untyped-def]
    if run.task.done():
        run.task.result()  # raise what ended it
    return bool(run.consumer.totals.acked >= n)


async def _ready_is(inbound: Inbound, n: int) -> bool:
    return await inbound.ready() == n


async def test_the_apps_ready_hooks_run_before_anything_is_taken(db, registry, inbound):
    await inbound.declare()
    await inbound.publish(*events("hooked", 2))
    seen: list[int] = []

    async def first() -> None:
        seen.append(await inbound.ready())  # nothing taken yet: both still in the queue

    async def broken() -> None:
        raise RuntimeError("no config")

    registry.on_ready(first)
    registry.on_ready(broken)
    consumer = InboxConsumer(
        db, registry, inbound.settings(), amqp_url=inbound.url, options=FAST, instance_id="c-1"
    )
    with pytest.raises(InstalledAppError, match=r"ready hook .*broken failed: RuntimeError"):
        await consumer.run(asyncio.Event())
    assert seen == [2] and await inbound.ready() == 2 and await count(db) == 0
