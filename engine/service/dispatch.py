"""Building and starting a dispatcher from settings given once.

``outbox-tui dispatch``, ``dispatch-once`` and the console's ``s`` all describe
their dispatcher as a ``DispatchSpec`` (settings, apps, instance id) and open it
with ``open_dispatcher``: the database (checked), the RabbitMQ relay when an
AMQP URL is set, and the ``OutboxDispatcher`` wired from the settings.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from engine.dispatch import OutboxDispatcher, default_dispatcher_id
from engine.errors import NothingToDeliverError
from engine.running.build import build_dispatcher
from engine.running.metrics import OutboxMetrics
from engine.running.run_loop import IterationCallback, run_dispatcher
from engine.running.summary import RunSummary
from engine.service.apps import delivery_problem
from engine.service.database import Purpose, open_database
from engine.settings import OutboxSettings
from engine.writing.registry import EventRegistry


@dataclass(frozen=True, slots=True)
class DispatchSpec:
    """One dispatcher, described once: where, with what, and under which id."""

    settings: OutboxSettings
    registry: EventRegistry
    installed_apps: tuple[str, ...] = ()
    instance_id: str = ""

    @property
    def dispatcher_id(self) -> str:
        return self.instance_id or default_dispatcher_id()

    @property
    def relaying(self) -> bool:
        return bool(self.settings.amqp_url)

    @property
    def target(self) -> str:
        """What the dispatcher delivers to: ``RabbitMQ relay`` or ``3 handlers``."""
        if self.relaying:
            return "RabbitMQ relay"
        count = sum(1 for _ in self.registry.all_handlers())
        return f"{count} handler{'s' if count != 1 else ''}"

    def problem(self) -> str | None:
        """Why starting would be refused, or None when it can start."""
        return delivery_problem(self.registry, relaying=self.relaying, apps=self.installed_apps)

    def check(self) -> None:
        problem = self.problem()
        if problem:
            raise NothingToDeliverError(problem)


@contextlib.asynccontextmanager
async def open_dispatcher(
    spec: DispatchSpec,
    *,
    purpose: Purpose = "dispatcher",
    metrics: OutboxMetrics | None = None,
    prefetch: bool = False,
) -> AsyncIterator[OutboxDispatcher]:
    """The checked database, the relay (if any) and the dispatcher; all closed on exit.

    ``prefetch``: the next batch is claimed while the last one is delivered (see
    docs/dispatcher.md, "Claim ahead and overlapping rounds", and decision 0018); for a
    run loop (which hands that batch back when it stops), not for a single round.
    """
    spec.check()
    settings = spec.settings
    async with (
        open_database(settings.database_url, purpose) as engine,
        contextlib.AsyncExitStack() as stack,
    ):
        publisher = None
        if settings.amqp_url:
            from engine.relay.rabbitmq import RabbitMqOutboxPublisher

            publisher = await stack.enter_async_context(
                RabbitMqOutboxPublisher(
                    settings.amqp_url,
                    exchange=settings.exchange,
                    probe_interval=settings.amqp_probe_seconds,
                    max_probe_interval=settings.amqp_max_probe_seconds,
                    observer=metrics,
                )
            )
        yield build_dispatcher(
            engine,
            spec.registry,
            settings.dispatcher,
            dispatcher_id=spec.dispatcher_id,
            external_publisher=publisher,
            metrics=metrics,
            prefetch=prefetch,
        )


async def run(
    spec: DispatchSpec,
    dispatcher: OutboxDispatcher,
    *,
    shutdown: asyncio.Event,
    max_iterations: int | None = None,
    on_iteration: IterationCallback | None = None,
) -> RunSummary:
    """The run loop with this spec's settings and heartbeat id."""
    return await run_dispatcher(
        dispatcher,
        settings=spec.settings.dispatcher,
        shutdown=shutdown,
        max_iterations=max_iterations,
        instance_id=spec.dispatcher_id,
        on_iteration=on_iteration,
    )
