"""Start and stop a dispatcher inside the console's process.

It is the same run loop as ``outbox-tui --dispatch`` (``engine.running.run_loop``): the
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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from engine.errors import OutboxError
from engine.running.metrics import OutboxMetrics
from engine.running.summary import RunSummary
from engine.service import DispatchSpec, open_dispatcher, run


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
        self, spec: DispatchSpec, *, on_exit: Callable[[DispatchExit], None] | None = None
    ) -> None:
        self.spec = spec
        self.on_exit = on_exit
        self._task: asyncio.Task[RunSummary | None] | None = None
        self._shutdown: asyncio.Event | None = None

    @property
    def instance_id(self) -> str:
        return self.spec.dispatcher_id

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def target(self) -> str:
        """What the dispatcher delivers to, for the header and toasts."""
        return self.spec.target

    def unavailable_reason(self) -> str | None:
        """Why ``start()`` would refuse, or None when it can start."""
        return self.spec.problem()

    async def start(self) -> None:
        """Connect and start the run loop in the background; raises ``OutboxError``."""
        if self.running:
            return
        stack = contextlib.AsyncExitStack()
        try:
            # Metrics of its own (served nowhere): its heartbeat then carries the lag the
            # overview shows.
            dispatcher = await stack.enter_async_context(
                open_dispatcher(self.spec, prefetch=True, metrics=OutboxMetrics())
            )
        except BaseException:
            await stack.aclose()
            raise
        shutdown = asyncio.Event()
        self._shutdown = shutdown
        loop = run(self.spec, dispatcher, shutdown=shutdown)
        self._task = asyncio.create_task(
            self._run(loop, stack, shutdown), name=f"dispatch {self.instance_id}"
        )

    async def _run(
        self,
        loop: Coroutine[Any, Any, RunSummary],
        stack: contextlib.AsyncExitStack,
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
            with contextlib.suppress(Exception):
                await stack.aclose()
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
