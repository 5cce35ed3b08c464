"""``stats`` shows the inbox: its consumers beside the dispatchers, the inbound events it
remembers and for how long (the dedup window)."""

from __future__ import annotations

import base64

from sqlalchemy import select

from engine import EventRegistry, create_engine, create_schema
from engine.inbox import InboxWriter, ReceivedMessage, RowBuilder, decode_message
from engine.inbox.heartbeat import CONSUMER_KIND, ConsumerTotals, consumer_details
from engine.running.heartbeat import Heartbeat
from engine.storage.schema import outbox_events as t
from tests.cli.conftest import Cli, cli  # noqa: F401 - shared fixture
from tests.inbox.corpus import LIMIT, STRUCTURED, TYPE, encoded, event


async def seed_inbox(db) -> None:
    registry = EventRegistry()
    registry.register_event(TYPE, 1)
    builder = RowBuilder(registry, queue="billing.inbox")
    rows = []
    for body in (encoded(event("s-1")), encoded(event("s-2")), b"garbage"):
        message = ReceivedMessage(body, STRUCTURED)
        rows.append(builder.row(message, decode_message(message, max_bytes=LIMIT)))
    await InboxWriter(db).write(rows)
    totals = ConsumerTotals(received=5, stored=3, duplicates=2, rejected=1, acked=5, batches=2)
    for instance_id, waiting in (("inbox-1", None), ("inbox-2", "broker unavailable: gone")):
        beat = Heartbeat(db, instance_id, kind=CONSUMER_KIND)
        details = consumer_details(
            queue="billing.inbox",
            bindings=["outbox.events:orders.#"],
            prefetch=1000,
            max_batch=500,
            totals=totals,
            waiting_for=waiting,
            last_error=waiting,
            heartbeat_seconds=5.0,
        )
        await beat.beat(details, force=True)
    await Heartbeat(db, "dispatcher-1").beat({"iterations": 3, "serves": [TYPE]}, force=True)


async def test_stats_shows_consumers_and_what_the_inbox_remembers(
    cli: Cli,  # noqa: F811
    database_url: str,
) -> None:
    db = create_engine(database_url)
    try:
        await create_schema(db)
        await seed_inbox(db)
    finally:
        await db.dispose()
    env = {"OUTBOX_DATABASE_URL": database_url, "OUTBOX_DEDUP_WINDOW_SECONDS": "3600"}
    record = cli("stats", "--json", env=env).json()
    assert record["inbound_rows"] == 2  # the dead letter has no identity to remember
    assert record["inbound_retention_seconds"] == 3600
    consumers = {hb["instance_id"]: hb for hb in record["heartbeats"] if hb["kind"] == "consumer"}
    assert set(consumers) == {"inbox-1", "inbox-2"}
    assert consumers["inbox-1"]["queue"] == "billing.inbox"
    assert consumers["inbox-1"]["totals"]["received"] == 5
    assert consumers["inbox-1"]["totals"]["duplicates"] == 2
    assert consumers["inbox-2"]["waiting_for"] == "broker unavailable: gone"
    [dispatcher] = [hb for hb in record["heartbeats"] if hb["kind"] == "dispatcher"]
    assert dispatcher["queue"] is None and "published" in dispatcher["totals"]

    text = cli("stats", "--inbound-retention-seconds", "600", env=env)
    assert text.returncode == 0, text
    assert "inbound events remembered (dedup window 10m 0s)" in text.stdout
    assert "inbox consumers (heartbeats)" in text.stdout
    assert "billing.inbox" in text.stdout
    assert "dispatchers (heartbeats)" in text.stdout


async def test_the_event_command_shows_an_undecodable_messages_raw_body(
    cli: Cli,  # noqa: F811
    sqlite_url: str,
) -> None:
    db = create_engine(sqlite_url)
    try:
        await create_schema(db)
        await seed_inbox(db)
        async with db.connect() as conn:
            [(event_id,)] = (
                await conn.execute(select(t.c.id).where(t.c.status == "dead_letter"))
            ).all()
    finally:
        await db.dispose()
    record = cli("event", event_id, "--json", env={"OUTBOX_DATABASE_URL": sqlite_url}).json()
    assert base64.b64decode(record["inbound_body"]) == b"garbage"
    assert record["inbound_queue"] == "billing.inbox"
    assert record["payload"]["amqp"]["content_type"] == STRUCTURED
