"""Prometheus metrics: counters per round, gauges refreshed from the database, the endpoint."""

from __future__ import annotations

import asyncio
import urllib.request
from datetime import timedelta

from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from engine import DispatchResult, EventHandlerPermanentError
from engine.running.build import build_dispatcher
from engine.running.metrics import OutboxMetrics, serve_metrics
from engine.running.run_loop import run_dispatcher
from engine.storage.schema import outbox_events

from .conftest import fast, publish


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


def value(metrics: OutboxMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


async def test_counters_after_rounds_and_gauges_from_the_database(db, registry):
    @registry.handler("orders.placed", key="orders.mixed")
    async def mixed(envelope):
        kind = envelope.payload["order_id"].split("-")[0]
        if kind == "flaky":
            raise ConnectionError("crm down")
        if kind == "bad":
            raise EventHandlerPermanentError("account closed")

    await publish(db, registry, count=3, prefix="ok")
    await publish(db, registry, count=1, prefix="flaky")
    await publish(db, registry, count=1, prefix="bad")
    metrics = OutboxMetrics()
    dispatcher = build_dispatcher(db, registry, fast(batch_size=10), metrics=metrics)
    assert await dispatcher.dispatch_once() == DispatchResult(
        claimed=5, published=3, failed=1, dead_lettered=1
    )
    assert value(metrics, "outbox_events_claimed_total") == 5
    assert value(metrics, "outbox_events_published_total") == 3
    assert value(metrics, "outbox_events_failed_total") == 1
    assert value(metrics, "outbox_events_dead_lettered_total") == 1
    assert value(metrics, "outbox_events_lost_leases_total") == 0
    assert dispatcher.observers == [metrics]

    await publish(db, registry, count=2, prefix="later")
    async with db.connect() as conn:
        oldest = (
            await conn.execute(
                select(func.min(outbox_events.c.created_at)).where(
                    outbox_events.c.status == "pending"
                )
            )
        ).scalar_one()
    metrics._clock = lambda: oldest + timedelta(seconds=42)
    await metrics.refresh_gauges(db)
    assert value(metrics, "outbox_events_pending") == 2
    assert value(metrics, "outbox_events_retrying") == 1
    assert value(metrics, "outbox_events_publishing") == 0
    assert value(metrics, "outbox_events_dead_letter") == 1
    assert value(metrics, "outbox_oldest_pending_age_seconds") == 42


async def test_lost_leases_are_counted_and_instances_do_not_collide():
    first, second = OutboxMetrics(), OutboxMetrics()
    await first.observe_round(DispatchResult(claimed=2, published=1, lost_leases=1))
    assert value(first, "outbox_events_lost_leases_total") == 1
    assert value(second, "outbox_events_lost_leases_total") == 0
    shared = CollectorRegistry()
    assert OutboxMetrics(shared).registry is shared


async def test_the_run_loop_refreshes_gauges_and_counts_purges(db, registry):
    @registry.handler("orders.placed", key="orders.noop")
    async def noop(envelope):
        pass

    await publish(db, registry, count=4)
    metrics = OutboxMetrics()
    settings = fast(retention_seconds=0)
    await run_dispatcher(
        build_dispatcher(db, registry, settings, metrics=metrics),
        settings=settings,
        max_iterations=2,
    )
    assert value(metrics, "outbox_events_published_total") == 4
    assert value(metrics, "outbox_events_purged_total") == 4
    # refreshed on the first iteration (after the round), then not again within 5 s
    assert value(metrics, "outbox_events_pending") == 0
    assert value(metrics, "outbox_oldest_pending_age_seconds") == 0


async def test_metrics_are_served_over_http_on_loopback():
    metrics = OutboxMetrics()
    await metrics.observe_round(DispatchResult(claimed=3, published=3))
    server = serve_metrics(0, metrics.registry)
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        url = f"http://127.0.0.1:{port}/metrics"
        body = await asyncio.to_thread(fetch, url)
    finally:
        server.shutdown()
        server.server_close()
    text = body.decode()
    assert "outbox_events_published_total 3.0" in text
    assert "outbox_oldest_pending_age_seconds" in text
