"""The headless run loop (``--dispatch``): JSON lines, heartbeats, SIGTERM, metrics, RabbitMQ."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import urllib.request
import uuid

import aio_pika
import pytest

from engine import create_engine
from engine.operating.insights import HeartbeatView, OutboxInsights
from tests.cli.conftest import APP, Cli, read_json_lines, sqlite_only, status_counts

RUN_KEYS = {
    "event",
    "iterations",
    "claimed",
    "published",
    "failed",
    "dead_lettered",
    "lost_leases",
    "purged",
    "storage_errors",
    "shutdown_requested",
    "idle_waits",
    "wakeups",
    "last_error",
    "instance_id",
    "elapsed_seconds",
    "rate_per_second",
}
ITERATION_KEYS = {
    "event",
    "iteration",
    "claimed",
    "published",
    "failed",
    "dead_lettered",
    "lost_leases",
    "totals",
    "elapsed_seconds",
    "rate_per_second",
}


async def heartbeat(url: str, instance_id: str) -> HeartbeatView:
    engine = create_engine(url)
    try:
        beats = await OutboxInsights(engine).heartbeats()
    finally:
        await engine.dispose()
    return next(hb for hb in beats if hb.instance_id == instance_id)


@pytest.mark.all_drivers
async def test_dispatch_for_n_iterations_prints_json_lines(cli: Cli, orders_url: str) -> None:
    result = cli(
        "--dispatch",
        "--installed-app",
        APP,
        "--max-iterations",
        "3",
        "--batch-size",
        "5",
        "--idle-sleep-seconds",
        "0.1",
        "--json",
        env={"OUTBOX_DATABASE_URL": orders_url},
    )
    assert result.returncode == 0, result
    lines = result.json_lines()
    started, *iterations, summary = lines
    assert started["event"] == "started"
    assert re.fullmatch(r".+:\d+", started["instance_id"])  # <host>:<pid>
    assert started["delivery"] == "handlers" and started["settings"]["batch_size"] == 5
    # The example orders each order's events, and a claim whose walk over keys reaches the
    # last key can come up empty before it starts over; a round that claimed nothing
    # prints no line. So: at most one line per round, in round order.
    assert 1 <= len(iterations) <= 3
    assert all(line["event"] == "iteration" for line in iterations)
    assert all(set(line) == ITERATION_KEYS for line in iterations)
    numbers = [line["iteration"] for line in iterations]
    assert numbers == sorted(set(numbers)) and set(numbers) <= {1, 2, 3}
    assert set(summary) == RUN_KEYS
    assert summary["event"] == "summary" and summary["shutdown_requested"] is False
    assert summary["iterations"] == 3
    assert summary["claimed"] == sum(line["claimed"] for line in iterations) >= 5
    assert summary["instance_id"] == started["instance_id"]
    assert (await status_counts(orders_url))["pending"] == 24 - summary["claimed"]

    hb = await heartbeat(orders_url, started["instance_id"])
    assert hb.state == "stopped" and hb.iterations == 3


def _scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


@pytest.mark.all_drivers
async def test_sigterm_finishes_the_batch_and_exits_zero(cli: Cli, orders_url: str) -> None:
    proc = cli.popen(
        "--dispatch",
        "--installed-app",
        APP,
        "--batch-size",
        "2",
        "--idle-sleep-seconds",
        "0.2",
        "--metrics-port",
        "0",
        "--json",
        env={"OUTBOX_DATABASE_URL": orders_url},
    )
    try:
        lines = read_json_lines(proc)
        started = next(lines)
        assert started["event"] == "started"
        first = next(lines)
        assert first["event"] == "iteration" and first["claimed"] == 2
        url = f"http://127.0.0.1:{started['metrics_port']}/metrics"
        assert b"outbox_events_claimed_total" in await asyncio.to_thread(_scrape, url)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    summary = json.loads(stdout.splitlines()[-1])
    assert summary["event"] == "summary" and summary["shutdown_requested"] is True
    assert summary["claimed"] >= 2
    hb = await heartbeat(orders_url, started["instance_id"])
    assert hb.state == "stopped"
    assert hb.total("claimed") == summary["claimed"]


@sqlite_only
async def test_dispatch_without_json_prints_a_summary(cli: Cli, orders_url: str) -> None:
    result = cli(
        "--dispatch",
        "--installed-app",
        APP,
        "--max-iterations",
        "1",
        env={"OUTBOX_DATABASE_URL": orders_url},
    )
    assert result.returncode == 0, result
    assert "dispatch run summary" in result.stdout
    assert "dispatching as " in result.stderr


@pytest.mark.rabbitmq
@sqlite_only
async def test_dispatch_once_relays_to_rabbitmq(cli: Cli, orders_url: str, amqp_url: str) -> None:
    exchange_name = f"cli-test-{uuid.uuid4().hex}"
    connection = await aio_pika.connect(amqp_url, timeout=10)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(
            exchange_name, aio_pika.ExchangeType.TOPIC, durable=True
        )
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(exchange, routing_key="#")
        try:
            result = cli(
                "dispatch-once",
                "--amqp-url",
                amqp_url,
                "--exchange",
                exchange_name,
                "--installed-app",
                APP,
                "--json",
                env={"OUTBOX_DATABASE_URL": orders_url},
            )
        finally:
            await exchange.delete()
        assert result.returncode == 0, result
        record = result.json()
        # 20 orders' placed events; each cancellation waits behind its order's.
        assert record["claimed"] == record["published"] == 20
        message = await queue.get(timeout=10, fail=True)
        assert message is not None
        await message.ack()
        assert message.routing_key in ("orders.placed", "orders.cancelled")


def test_dispatch_rounds_run_with_a_lazier_collector_and_give_it_back() -> None:
    import gc

    from outbox_tui.cli.dispatch import ROUND_GC_THRESHOLD, _collector_for_rounds

    before = gc.get_threshold()
    with _collector_for_rounds():
        assert gc.get_threshold() == (ROUND_GC_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0  # start-up's objects are left out of collections
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_dispatch_rounds_hand_the_gil_over_sooner_and_give_the_interval_back() -> None:
    import sys

    from outbox_tui.cli.dispatch import ROUND_SWITCH_INTERVAL_SECONDS, _prompt_thread_switches

    before = sys.getswitchinterval()
    with _prompt_thread_switches():
        assert sys.getswitchinterval() == pytest.approx(ROUND_SWITCH_INTERVAL_SECONDS)
    assert sys.getswitchinterval() == before
