"""Start and stop a dispatcher inside the console's process.

It is the same run loop as ``outbox-tui --dispatch`` (``engine.runner``): the
handlers of ``--installed-app`` modules, or the RabbitMQ relay when an AMQP URL
is given, and a heartbeat row like any other dispatcher's, under the instance id
``console:<host>:<pid>``. Stopping is graceful: the loop finishes its current
batch, marks its heartbeat stopped and only then lets go of its connections.

No Textual here: the app drives this object from workers and hears about an
unrequested exit (a crash) through ``on_exit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncEngine

from engine.database import create_engine
from engine.errors import ConfigurationError, OutboxError
from engine.registry import EventRegistry
from engine.runner import RunSummary, build_dispatcher, run_dispatcher
from engine.settings import DispatcherSettings, load_settings
from outbox_tui.apps import delivery_problem

if TYPE_CHECKING:
    from engine.relay.rabbitmq import RabbitMqOutboxPublisher


class DispatchUnavailableError(ConfigurationError):
    """The console was given nothing to dispatch to."""


@dataclass(frozen=True, slots=True)
class DispatchExit:
    """How a run ended: its summary, or the one-line error that ended it."""

    summary: RunSummary | None
    error: str | None
    requested: bool  # True when stop() asked for it


def console_instance_id() -> str:
    return f"console:{socket.gethostname()}:{os.getpid()}"


def describe_summary(summary: RunSummary | None) -> str:
    """One line about a finished run, e.g. ``12 rounds, 340 published, 2 failed``."""
    if summary is None:
        return ""
    parts = [f"{summary.iterations} round{'s' if summary.iterations != 1 else ''}"]
    for name in ("published", "failed", "dead_lettered"):
        value = getattr(summary, name)
        if value:
            parts.append(f"{value} {name.replace('_', ' ')}")
    return ", ".join(parts)


class DispatchControl:
    """One optional in-process dispatcher: ``start()``, ``stop()``, ``running``."""

    def __init__(
        self,
        database_url: str,
        registry: EventRegistry,
        *,
        amqp_url: str | None = None,
        exchange: str | None = None,
        settings: DispatcherSettings | None = None,
        instance_id: str | None = None,
        installed_apps: Sequence[str] = (),
        on_exit: Callable[[DispatchExit], None] | None = None,
    ) -> None:
        self.database_url = database_url
        self.registry = registry
        self.amqp_url = amqp_url
        self.exchange = exchange
        self.settings = settings
        self.instance_id = instance_id or console_instance_id()
        self.installed_apps = tuple(installed_apps)
        self.on_exit = on_exit
        self._task: asyncio.Task[RunSummary | None] | None = None
        self._shutdown: asyncio.Event | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def target(self) -> str:
        """What the dispatcher delivers to, for the header and toasts."""
        if self.amqp_url:
            return "RabbitMQ relay"
        count = sum(1 for _ in self.registry.all_handlers())
        return f"{count} handler{'s' if count != 1 else ''}"

    def unavailable_reason(self) -> str | None:
        """Why ``start()`` would refuse, or None when it can start."""
        return delivery_problem(
            self.registry, relaying=bool(self.amqp_url), apps=self.installed_apps
        )

    async def start(self) -> None:
        """Connect and start the run loop in the background; raises ``OutboxError``."""
        if self.running:
            return
        reason = self.unavailable_reason()
        if reason:
            raise DispatchUnavailableError(reason)
        settings = self.settings or load_settings().dispatcher
        engine = create_engine(self.database_url)
        publisher = None
        try:
            if self.amqp_url:
                from engine.relay.rabbitmq import RabbitMqOutboxPublisher

                publisher = (
                    RabbitMqOutboxPublisher(self.amqp_url, exchange=self.exchange)
                    if self.exchange
                    else RabbitMqOutboxPublisher(self.amqp_url)
                )
                await publisher.connect()
            dispatcher = build_dispatcher(
                engine,
                self.registry,
                settings,
                dispatcher_id=self.instance_id,
                external_publisher=publisher,
            )
        except BaseException:
            if publisher is not None:
                with contextlib.suppress(Exception):
                    await publisher.close()
            await engine.dispose()
            raise
        shutdown = asyncio.Event()
        self._shutdown = shutdown
        loop = run_dispatcher(
            dispatcher, settings=settings, shutdown=shutdown, instance_id=self.instance_id
        )
        self._task = asyncio.create_task(
            self._run(loop, engine, publisher, shutdown), name=f"dispatch {self.instance_id}"
        )

    async def _run(
        self,
        loop: Coroutine[Any, Any, RunSummary],
        engine: AsyncEngine,
        publisher: RabbitMqOutboxPublisher | None,
        shutdown: asyncio.Event,
    ) -> RunSummary | None:
        summary: RunSummary | None = None
        error: str | None = None
        try:
            summary = await loop
        except asyncio.CancelledError:
            raise
        except OutboxError as exc:
            error = str(exc)
        except Exception as exc:  # a handler bug escaping the loop must not kill the console
            error = f"{type(exc).__name__}: {exc}"
        finally:
            if publisher is not None:
                with contextlib.suppress(Exception):
                    await publisher.close()
            await engine.dispose()
        if self.on_exit is not None:
            self.on_exit(DispatchExit(summary, error, requested=shutdown.is_set()))
        return summary

    async def stop(self) -> DispatchExit | None:
        """Ask the loop to stop after its current batch and wait for it; None if not running."""
        task, shutdown = self._task, self._shutdown
        if task is None or shutdown is None or task.done():
            return None
        shutdown.set()
        try:
            # Shielded: cancelling the caller (the console quitting) must not cut a batch short.
            summary = await asyncio.shield(task)
        except OutboxError as exc:
            return DispatchExit(None, str(exc), requested=True)
        return DispatchExit(summary, None, requested=True)
