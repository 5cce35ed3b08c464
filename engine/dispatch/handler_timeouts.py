"""Per-handler timeouts for a round's workers, kept by one timer instead of one per call.

``asyncio.timeout`` schedules and cancels a timer (a heap entry and a copied context) for
every handler call, a large share of a quick handler's cost (see decision 0017).
Every handler of a round has the same limit, so the earliest deadline is always the one
of the handler that started first; one watcher task sleeps until then, cancels any worker
whose handler has run past the limit, and sleeps again. The cancelled worker gets
``HandlerTimedOut`` (a ``TimeoutError``) from ``run`` instead of the cancellation, as
``asyncio.timeout`` would raise; a cancellation from elsewhere (a shutdown) goes on as one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class HandlerTimedOut(TimeoutError):
    """A handler ran past ``handler_timeout_seconds`` and was cancelled."""


class CancelledByHandler(Exception):
    """A handler raised ``CancelledError`` while no one cancelled its worker (it awaited a
    future or task that was cancelled under it): a failure of that handler, not a reason
    to abort the round and every other handler in flight."""


class HandlerTimeouts:
    """Run awaitables in the calling task, each cancelled once it runs ``limit`` seconds."""

    def __init__(self, limit: float) -> None:
        self._limit = limit
        self._running: dict[asyncio.Task[Any], float] = {}  # worker -> its call's start
        self._expired: set[asyncio.Task[Any]] = set()
        self._watcher: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()

    async def run(self, call: Awaitable[T], task: asyncio.Task[Any] | None = None) -> T:
        """Await ``call`` in ``task`` (the current task; a worker passes its own, once)."""
        if task is None:
            task = asyncio.current_task()
            if task is None:  # pragma: no cover - always called from a task
                raise RuntimeError("HandlerTimeouts.run() needs a running task")
        self._running[task] = self._loop.time()
        if self._watcher is None:
            self._watcher = self._loop.create_task(self._watch())
        try:
            return await call
        except asyncio.CancelledError:
            if task in self._expired:
                self._expired.discard(task)
                if task.uncancel() == 0:  # ours was the only cancellation
                    raise HandlerTimedOut from None
            elif task.cancelling() == 0:
                raise CancelledByHandler("raised CancelledError without being cancelled") from None
            raise
        finally:
            del self._running[task]
            if task in self._expired:  # cancelled, but the call swallowed it and returned
                self._expired.discard(task)
                task.uncancel()

    def close(self) -> None:
        """Stop the watcher (the round's workers are done)."""
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def _watch(self) -> None:
        while True:
            now = self._loop.time()
            earliest = now
            for task, started in self._running.items():
                if task in self._expired:
                    continue
                if now - started >= self._limit:
                    self._expired.add(task)
                    task.cancel()
                else:
                    earliest = min(earliest, started)
            # A call that starts after this point has a later deadline than this wake-up.
            await asyncio.sleep(earliest + self._limit - now)
