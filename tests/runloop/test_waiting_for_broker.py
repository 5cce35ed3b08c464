"""A relay whose circuit is open: the loop claims nothing, and the heartbeat, `stats` and the
console's dispatcher panel say the dispatcher is waiting for its broker."""

from __future__ import annotations

import asyncio

from rich.console import Console

from engine.dispatch import ExternalPublishResult
from engine.operating.insights import OutboxInsights
from engine.running.build import build_dispatcher
from engine.running.run_loop import run_dispatcher
from outbox_tui import output

from .conftest import fast, publish, statuses


class BrokerAway:
    """An external publisher whose broker is known to be away (its circuit is open)."""

    waiting_reason = "broker unavailable: cannot reach RabbitMQ at amqp://relay:***@mq/"

    def __init__(self) -> None:
        self.published = 0

    async def ready(self) -> bool:
        return False

    async def publish(self, envelopes):
        self.published += len(envelopes)
        return ExternalPublishResult(published={e.event_id for e in envelopes})


async def test_an_open_circuit_claims_nothing_and_says_what_it_waits_for(db, registry):
    ids = await publish(db, registry, count=3)
    relay = BrokerAway()
    settings = fast(heartbeat_min_interval_seconds=0, heartbeat_seconds=0.05)
    dispatcher = build_dispatcher(db, registry, settings, external_publisher=relay)
    shutdown = asyncio.Event()
    loop = asyncio.create_task(
        run_dispatcher(dispatcher, settings=settings, shutdown=shutdown, instance_id="relay-1")
    )
    try:
        insights = OutboxInsights(db)
        give_up = asyncio.get_running_loop().time() + 20
        while True:  # while it runs: several rounds, each claiming nothing
            snapshot = await insights.overview()
            beats = snapshot.heartbeats
            if (beats and beats[0].iterations >= 3) or asyncio.get_running_loop().time() > give_up:
                break
            await asyncio.sleep(0.02)
        [beat] = snapshot.heartbeats
        assert beat.state == "alive" and beat.iterations >= 3
        assert beat.waiting_for == BrokerAway.waiting_reason
        record = output.stats_record(snapshot, "sqlite://")
        assert record["heartbeats"][0]["waiting_for"] == BrokerAway.waiting_reason
        console = Console(width=200, record=True)
        for table in output.stats_tables(snapshot, "sqlite://"):
            console.print(table)
        text = console.export_text()
        assert "alive · waiting for broker" in text, text
    finally:
        shutdown.set()
        summary = await loop
    assert summary.claimed == 0 and relay.published == 0
    assert set((await statuses(db)).values()) == {"pending"} and len(ids) == 3
