"""Per event type and outcome: the outbox lag, handler time, relay confirms, and the lag
percentiles heartbeats carry to ``stats``."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest
from rich.console import Console

from engine import EventHandlerPermanentError, OutboxEventPublisher, unit_of_work
from engine.operating.insights import OutboxInsights
from engine.running.build import build_dispatcher
from engine.running.lag import LAG_BUCKETS, LagWindow, lag_quantiles, merged_lag
from engine.running.metrics import OutboxMetrics
from engine.running.run_loop import run_dispatcher
from outbox_tui.output import stats_record, stats_tables
from tests.engine.conftest import CTX

from .conftest import fast, publish


async def publish_at(db, registry, clock, *order_ids: str) -> None:
    async with unit_of_work(db, registry=registry, context=CTX) as session:
        for order_id in order_ids:
            await OutboxEventPublisher(session, clock=clock).publish(
                "orders.placed", {"order_id": order_id}, aggregate_type="order",
                aggregate_id=order_id,
            )  # fmt: skip


def sample(metrics: OutboxMetrics, name: str, event_type: str, outcome: str) -> float | None:
    labels = {"event_type": event_type, "outcome": outcome}
    return metrics.registry.get_sample_value(name, labels)


async def test_lag_and_handler_time_by_event_type_and_outcome(db, registry, clock):
    @registry.handler("orders.placed", key="orders.mixed")
    async def mixed(envelope):
        kind = envelope.payload["order_id"].split("-")[0]
        if kind == "flaky":
            raise ConnectionError("crm down")
        if kind == "bad":
            raise EventHandlerPermanentError("account closed")
        await asyncio.sleep(0.02)

    await publish_at(db, registry, clock, "ok-1", "ok-2", "flaky-1", "bad-1")
    clock.advance(2.0)  # they waited two seconds in the outbox
    metrics = OutboxMetrics()
    dispatcher = build_dispatcher(db, registry, fast(), metrics=metrics, clock=clock)
    await dispatcher.dispatch_once()

    lag = "outbox_event_lag_seconds"
    assert sample(metrics, f"{lag}_count", "orders.placed", "published") == 2
    assert sample(metrics, f"{lag}_count", "orders.placed", "failed") == 1
    assert sample(metrics, f"{lag}_count", "orders.placed", "dead_letter") == 1
    assert sample(metrics, f"{lag}_sum", "orders.placed", "published") == pytest.approx(4.0)
    assert sample(metrics, f"{lag}_bucket", "orders.placed", "published") is None  # needs le
    duration = "outbox_handler_duration_seconds"
    assert sample(metrics, f"{duration}_count", "orders.placed", "published") == 2
    assert sample(metrics, f"{duration}_sum", "orders.placed", "published") >= 0.04
    assert sample(metrics, "outbox_events_processed_total", "orders.placed", "failed") == 1
    assert metrics.lag_window.counts()[LAG_BUCKETS.index(2.5)] == 4  # 2 s: the 2.5 s bucket

    text = generate_latest(metrics.registry).decode()
    assert "# TYPE outbox_event_lag_seconds histogram" in text
    assert "# TYPE outbox_events_processed_total counter" in text
    labelled = [line for line in text.splitlines() if line.startswith("outbox_") and "{" in line]
    names = {
        label.split("=")[0]
        for line in labelled
        for label in line[line.index("{") + 1 : line.index("}")].split(",")
    }
    assert names <= {"event_type", "outcome", "le"}  # never a tenant, an id or a key


def test_types_outside_the_registry_share_one_label(registry):
    metrics = OutboxMetrics()
    metrics.label_types(["orders.placed"])
    metrics.observe_delivery("orders.placed", "published", 0.1, 0.01)
    metrics.observe_delivery("tenant-42.custom", "published", 0.1, 0.01)
    metrics.observe_confirm("stranger.type", "published", 0.01)
    count = "outbox_event_lag_seconds_count"
    assert sample(metrics, count, "orders.placed", "published") == 1
    assert sample(metrics, count, "other", "published") == 1
    assert sample(metrics, count, "tenant-42.custom", "published") is None
    assert sample(metrics, "outbox_relay_confirm_seconds_count", "other", "published") == 1


def test_lag_percentiles_are_read_as_prometheus_reads_a_histogram():
    counts = [0] * (len(LAG_BUCKETS) + 1)
    counts[LAG_BUCKETS.index(0.1)] = 90  # 90 events in (0.05, 0.1]
    counts[LAG_BUCKETS.index(1.0)] = 10  # 10 in (0.5, 1.0]
    p50, p90, p99 = lag_quantiles(counts, (0.5, 0.9, 0.99))
    assert p50 == pytest.approx(0.05 + 0.05 * 50 / 90)
    assert p90 == pytest.approx(0.1)
    assert p99 == pytest.approx(0.5 + 0.5 * 9 / 10)
    counts[-1] = 1000  # above every bound: the highest bound, as histogram_quantile says
    assert lag_quantiles(counts, (0.99,)) == [3600.0]
    assert lag_quantiles([0] * len(counts), (0.5,)) == [None]


def test_the_window_forgets_what_is_older_than_a_minute():
    now = [0.0]
    window = LagWindow(60.0, monotonic=lambda: now[0])
    window.observe(0.2)
    now[0] = 30.0
    window.observe(3.0)
    assert sum(window.counts()) == 2
    now[0] = 65.0  # the first slot (0-10 s) has aged out, the 30 s one not
    assert sum(window.counts()) == 1
    now[0] = 100.0
    assert sum(window.counts()) == 0


def test_lag_adds_up_over_dispatchers_and_skips_what_is_not_a_lag():
    one, two = LagWindow(), LagWindow()
    for _ in range(9):
        one.observe(0.02)
    two.observe(20.0)
    merged = merged_lag(
        [
            {"lag": one.as_details(), "other": 1},
            {"lag": two.as_details()},
            {},
            {"lag": {"le": [1], "counts": [1]}},
        ]
    )
    assert merged is not None
    assert (merged.events, merged.dispatchers) == (10, 2)
    assert merged.p50_seconds is not None and merged.p50_seconds <= 0.025
    assert merged.p99_seconds is not None and 10 < merged.p99_seconds <= 30
    assert merged_lag([{}]) is None


async def test_a_live_dispatchers_heartbeat_carries_its_lag_to_stats(db, registry):
    @registry.handler("orders.placed", key="orders.ok")
    async def ok(envelope):
        pass

    await publish(db, registry, count=5)
    metrics = OutboxMetrics()
    dispatcher = build_dispatcher(db, registry, fast(), metrics=metrics)
    shutdown = asyncio.Event()
    loop = asyncio.create_task(
        run_dispatcher(dispatcher, settings=fast(), shutdown=shutdown, instance_id="measured")
    )
    try:
        snapshot = None
        for _ in range(200):
            snapshot = await OutboxInsights(db).overview()
            if snapshot.lag is not None and snapshot.lag.events == 5:
                break
            await asyncio.sleep(0.05)
        assert snapshot is not None and snapshot.lag is not None, "no heartbeat with the lag"
    finally:
        shutdown.set()
        await loop
    record = stats_record(snapshot, "db")
    assert (record["lag"]["events"], record["lag"]["dispatchers"]) == (5, 1)
    assert 0 <= record["lag"]["p50_seconds"] <= record["lag"]["p99_seconds"]
    rendered = Console(width=120, record=True)
    for table in stats_tables(snapshot, "db"):
        rendered.print(table)
    assert "lag p50 / p90 / p99 (last 1m 0s, 5 events)" in rendered.export_text()
    # Once it stopped, its heartbeat no longer counts.
    assert (await OutboxInsights(db).overview()).lag is None
    assert stats_record(await OutboxInsights(db).overview(), "db")["lag"] is None
