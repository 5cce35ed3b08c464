"""``outbox-tui consume``: the inbox's consumer, headless, until SIGTERM/SIGINT.

It describes its consumer once, as an ``engine.service.consume.ConsumeSpec`` built from
the settings (flags over ``OUTBOX_...`` variables), and opens it with ``open_consumer``.
Signals are handled from the first moment, as ``dispatch`` handles them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from engine.dispatch import default_dispatcher_id
from engine.inbox.consumer import BatchReport
from engine.inbox.heartbeat import ConsumerSummary, ConsumerTotals
from engine.service import load_registry
from engine.service.consume import ConsumeSpec, open_consumer
from engine.settings import ConsumerSettings, DispatcherSettings, OutboxSettings
from engine.writing.registry import EventRegistry
from outbox_tui import PROG
from outbox_tui.cli.dispatch import INSTANCE_ID, _shutdown_on_signals
from outbox_tui.cli.errors import EXIT_OK
from outbox_tui.cli.event_loop import STOP_REQUESTED
from outbox_tui.cli.options import (
    Invocation,
    add_bindings,
    add_json,
    add_settings,
    positive_int,
    subparser,
)
from outbox_tui.output.consume import ConsumeReporter

# The run loop's settings a consumer paces itself by (engine.inbox.consumer.ConsumerOptions).
RUN_SETTINGS = (
    "heartbeat_seconds",
    "heartbeat_min_interval_seconds",
    "storage_retry_initial_seconds",
    "storage_retry_max_seconds",
    "wakeup",
    "wakeup_channel",
)
BROKER_SETTINGS = ("amqp_url", "amqp_probe_seconds", "amqp_max_probe_seconds")


def register(sub: Any) -> None:
    p = subparser(
        sub,
        "consume",
        "take CloudEvents off a RabbitMQ queue into this outbox (the inbox)",
        "Consume a RabbitMQ queue into the outbox: each CloudEvent (structured or binary "
        "mode) becomes an outbox row that this service's dispatchers deliver, once per "
        "CloudEvents (source, id); batches are committed, then acked. A message that cannot "
        "be decoded is stored dead-lettered with its raw body. Declares the queue (durable) "
        "and its --bind bindings unless --passive. Runs until SIGTERM or SIGINT (the batch "
        "in hand is committed and acked, or left unacked), or --max-messages.",
        f"{PROG} consume --amqp-url amqp://guest:guest@rabbit/ --queue billing.inbox "
        "--bind outbox.events:orders.# --installed-app billing.outbox --json",
        f"{PROG} consume --queue billing.inbox --passive --prefetch 200 "
        "--installed-app billing.outbox",
    )
    broker = p.add_argument_group("broker")
    add_settings(broker, OutboxSettings, BROKER_SETTINGS)
    queue = p.add_argument_group("consumer settings (override OUTBOX_CONSUMER__*)")
    names = tuple(n for n in ConsumerSettings.model_fields if n != "bindings")
    add_settings(queue, ConsumerSettings, names[:1])
    add_bindings(queue)
    add_settings(queue, ConsumerSettings, names[1:])
    run_group = p.add_argument_group("run (override OUTBOX_DISPATCHER__*)")
    add_settings(run_group, DispatcherSettings, RUN_SETTINGS)
    run_group.add_argument(
        "--instance-id",
        metavar="ID",
        type=INSTANCE_ID,
        default=argparse.SUPPRESS,
        help="consumer and heartbeat id (default <host>:<pid>)",
    )
    run_group.add_argument(
        "--max-messages",
        metavar="N",
        type=positive_int,
        default=argparse.SUPPRESS,
        help="stop once N messages were acked (default: run until SIGTERM/SIGINT)",
    )
    add_json(run_group, "one JSON object per line on stdout")
    p.set_defaults(run=consume)


def spec_of(inv: Invocation) -> ConsumeSpec:
    """The consumer this invocation describes (refused when something it needs is missing)."""
    apps = tuple(inv.installed_apps)
    registry = load_registry(apps, app_dir=inv.app_dir) if apps else EventRegistry()
    spec = ConsumeSpec(
        inv.settings, registry, apps, inv.opt("instance_id") or default_dispatcher_id()
    )
    spec.check()
    return spec


def _details(inv: Invocation, spec: ConsumeSpec) -> dict[str, Any]:
    consumer = inv.settings.consumer
    return {
        "instance_id": spec.consumer_id,
        "database_url": inv.masked_url,
        "amqp_url": spec.masked_amqp_url,
        "queue": consumer.queue,
        "installed_apps": list(spec.installed_apps),
        "max_messages": inv.opt("max_messages"),
        "settings": consumer.model_dump(mode="json"),
    }


async def consume(inv: Invocation) -> int:
    shutdown, starting = asyncio.Event(), [True]
    reporter = ConsumeReporter(inv.out)
    instance_id = inv.opt("instance_id") or default_dispatcher_id()
    with _shutdown_on_signals(shutdown, starting):
        try:
            summary = await _consume(inv, reporter, shutdown, starting)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if STOP_REQUESTED not in exc.args or task is None:
                raise
            task.uncancel()
            summary = ConsumerSummary(ConsumerTotals(), shutdown_requested=True)
    reporter.finished(summary.as_dict(), instance_id)
    return EXIT_OK


async def _consume(
    inv: Invocation, reporter: ConsumeReporter, shutdown: asyncio.Event, starting: list[bool]
) -> ConsumerSummary:
    spec = spec_of(inv)
    async with open_consumer(spec) as consumer, _ticking(reporter):
        reporter.started(_details(inv, spec))
        starting[0] = False  # from here on a signal lets the batch in hand finish

        def batch(report: BatchReport) -> None:
            totals = report.totals.as_dict()
            reporter.batch(report.size, len(report.result.stored), report.result.duplicates, totals)

        try:
            return await consumer.run(
                shutdown,
                max_messages=inv.opt("max_messages"),
                on_batch=batch,
                on_waiting=reporter.waiting,
            )
        finally:
            reporter.stop()


@contextlib.asynccontextmanager
async def _ticking(reporter: ConsumeReporter) -> AsyncIterator[None]:
    """The reporter's ``idle`` lines while the run waits."""

    async def tick() -> None:
        while True:
            await asyncio.sleep(1.0)
            reporter.tick()

    task = asyncio.create_task(tick())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
