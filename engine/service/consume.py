"""Building and starting an inbox consumer from settings given once (``outbox-tui consume``).

A ``ConsumeSpec`` names what a consumer needs (the broker, the queue, the installed apps
whose registry says which types this service serves and how they are ordered);
``open_consumer`` opens the database (checked, as for a dispatcher) and builds the
``InboxConsumer`` wired from the settings.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from engine.dispatch import default_dispatcher_id
from engine.errors import ConfigurationError
from engine.inbox.consumer import ConsumerOptions, InboxConsumer
from engine.relay.broker import check_amqp_url
from engine.service.database import open_database
from engine.settings import OutboxSettings
from engine.storage.secrets import mask_url
from engine.writing.registry import EventRegistry


@dataclass(frozen=True, slots=True)
class ConsumeSpec:
    """One consumer, described once: from which broker and queue, into which database."""

    settings: OutboxSettings
    registry: EventRegistry
    installed_apps: tuple[str, ...] = ()
    instance_id: str = ""

    @property
    def consumer_id(self) -> str:
        return self.instance_id or default_dispatcher_id()

    @property
    def masked_amqp_url(self) -> str | None:
        url = self.settings.amqp_url
        return mask_url(url) if url else None

    def problem(self) -> str | None:
        """Why starting would be refused, or None when it can start."""
        if not self.settings.amqp_url:
            return "consume needs the broker: --amqp-url (or OUTBOX_AMQP_URL)"
        if not self.settings.consumer.queue:
            return "consume needs a queue: --queue (or OUTBOX_CONSUMER__QUEUE)"
        if not self.installed_apps:
            return (
                "consume needs --installed-app: its registry says which event types this "
                "service serves and how they are ordered"
            )
        return None

    def check(self) -> None:
        problem = self.problem()
        if problem:
            raise ConfigurationError(problem)
        check_amqp_url(str(self.settings.amqp_url))


@contextlib.asynccontextmanager
async def open_consumer(spec: ConsumeSpec) -> AsyncIterator[InboxConsumer]:
    """The checked database and the consumer (not connected yet: ``run`` connects)."""
    spec.check()
    settings = spec.settings
    assert settings.amqp_url is not None  # spec.check()
    async with open_database(settings.database_url, "dispatcher") as engine:
        yield InboxConsumer(
            engine,
            spec.registry,
            settings.consumer,
            amqp_url=settings.amqp_url,
            options=ConsumerOptions.of(
                settings.dispatcher,
                probe_seconds=settings.amqp_probe_seconds,
                max_probe_seconds=settings.amqp_max_probe_seconds,
            ),
            instance_id=spec.consumer_id,
            notify_channel=(
                settings.dispatcher.wakeup_channel if settings.dispatcher.wakeup == "auto" else None
            ),
        )
