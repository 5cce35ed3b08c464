"""The dispatcher's run loop: rounds, idle sleep, wake-ups, housekeeping, shutdown.

``run_dispatcher`` repeats ``dispatch_once``. After a round that claimed
nothing it waits ``idle_sleep_seconds`` on the shutdown event and, on
PostgreSQL, on a wake-up notification (engine.running.wakeup), whichever comes first;
after a round that claimed something it goes straight on. Setting the
shutdown event lets the handlers in flight finish (each within its timeout),
hands the events not yet started back unattempted, records the round and then
returns the summary.

A storage failure (database unreachable, a write refused) is logged on one
line with passwords masked, counted in ``storage_errors``, and the loop waits
``storage_retry_initial_seconds`` doubling up to ``storage_retry_max_seconds``
(interruptible by shutdown) before trying again. Rows it had claimed go back
to the pool when their lease expires. Any other exception is a bug and
propagates, after the heartbeat row has been marked stopped.

Housekeeping rides on the loop instead of extra tasks: the heartbeat upsert
(throttled, see engine.running.heartbeat), metric gauges and the retention purge (at
most every ``housekeeping_seconds``; the purge runs again at once while it
finds full batches, and after every round that published when
``retention_seconds`` is 0). Inbound rows are kept for their own window,
``inbound_retention_seconds``: the inbox's dedup window.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.clock import Clock
from engine.dispatch import DispatchResult, OutboxDispatcher
from engine.errors import InstalledAppError, StorageError
from engine.operating.retention import (
    inbound_window,
    purge_heartbeats,
    purge_inbound,
    purge_published,
    retention_cutoff,
)
from engine.running.heartbeat import Heartbeat
from engine.running.metrics import OutboxMetrics
from engine.running.summary import RunSummary
from engine.running.wakeup import WakeupListener
from engine.settings import DispatcherSettings
from engine.storage.database import translate_storage_error
from engine.storage.secrets import mask_secrets
from engine.writing.registry import EventRegistry

log = logging.getLogger("engine.runner")

#: What counts as a storage failure of a round; anything else propagates.
STORAGE_ERRORS: tuple[type[BaseException], ...] = (
    StorageError,
    sa_exc.DBAPIError,  # OperationalError, InterfaceError, ProgrammingError (missing table), ...
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,  # connection pool exhausted
    OSError,  # refused connections, unreachable files; includes TimeoutError
)

IterationCallback = Callable[[RunSummary, DispatchResult], None]


async def await_ready_hooks(registry: EventRegistry) -> None:
    """The installed apps' start-up hooks (``EventRegistry.on_ready``), in registration
    order; one that raises ends the run before it starts (``InstalledAppError``)."""
    for hook in registry.ready_hooks():
        try:
            await hook()
        except Exception as exc:
            name = getattr(hook, "__qualname__", repr(hook))
            raise InstalledAppError(
                f"the ready hook {name} failed: {type(exc).__name__}: {exc}"
            ) from exc


async def run_dispatcher(
    dispatcher: OutboxDispatcher,
    *,
    settings: DispatcherSettings | None = None,
    shutdown: asyncio.Event | None = None,
    max_iterations: int | None = None,
    instance_id: str | None = None,
    on_iteration: IterationCallback | None = None,
    clock: Clock | None = None,
) -> RunSummary:
    """Run rounds until ``shutdown`` is set or ``max_iterations`` rounds ran.

    ``on_iteration`` gets a copy of the cumulative summary and the round's
    result after every iteration. With ``instance_id`` the process keeps a
    heartbeat row. ``clock`` (default: the dispatcher's) dates heartbeats and
    the retention cut-off.
    """
    loop = _RunLoop(
        dispatcher,
        settings or DispatcherSettings(),
        shutdown if shutdown is not None else asyncio.Event(),
        clock or _clock_of(dispatcher),
        instance_id,
        on_iteration,
    )
    return await loop.run(max_iterations)


def _clock_of(dispatcher: OutboxDispatcher) -> Clock:
    return dispatcher.clock


class _RunLoop:
    def __init__(
        self,
        dispatcher: OutboxDispatcher,
        settings: DispatcherSettings,
        shutdown: asyncio.Event,
        clock: Clock,
        instance_id: str | None,
        on_iteration: IterationCallback | None,
    ) -> None:
        self.dispatcher = dispatcher
        self.engine: AsyncEngine = dispatcher.engine
        self.settings = settings
        self.shutdown = shutdown
        self.clock = clock
        self.on_iteration = on_iteration
        self.summary = RunSummary()
        self.metrics = [o for o in dispatcher.observers if isinstance(o, OutboxMetrics)]
        self.heartbeat = (
            Heartbeat(
                self.engine,
                instance_id,
                min_interval=settings.heartbeat_min_interval_seconds,
                clock=clock,
            )
            if instance_id
            else None
        )
        self.listener: WakeupListener | None = None
        self._retry_delay = settings.storage_retry_initial_seconds
        self._next_gauges = 0.0
        self._next_purge = 0.0
        self._next_heartbeat_purge = 0.0
        self._purge_backlog = False

    # -- the loop ------------------------------------------------------------
    async def run(self, max_iterations: int | None) -> RunSummary:
        summary = self.summary
        try:
            await self._start()
            while max_iterations is None or summary.iterations < max_iterations:
                if self.shutdown.is_set():
                    break
                if self.listener is not None:
                    self.listener.clear()  # a notification from now on wakes the next sleep
                ok, result = await self._iteration()
                if self.on_iteration is not None:
                    self.on_iteration(dataclasses.replace(summary), result)
                if self.shutdown.is_set():
                    break
                if max_iterations is not None and summary.iterations >= max_iterations:
                    break
                if not ok:
                    await self._wait(self._storage_delay(), notify=False)
                elif not self.dispatcher.holds_claimed_batch and (
                    result.claimed == 0 or not (result.published or result.dead_lettered)
                ):
                    # Nothing claimed, or nothing moved on (every row failed or was handed
                    # back, as in a broker outage): wait rather than spin on the same rows.
                    await self._idle_wait()
        finally:
            summary.shutdown_requested = self.shutdown.is_set()
            await self._stop()
        return summary

    async def _iteration(self) -> tuple[bool, DispatchResult]:
        try:
            result = await self.dispatcher.dispatch_once(stop=self.shutdown)
        except STORAGE_ERRORS as exc:
            self.summary.iterations += 1
            self._storage_failed(exc, "dispatch round")
            return False, DispatchResult()
        self.summary.iterations += 1
        self.summary.add(result)
        try:
            await self._housekeeping(result)
        except STORAGE_ERRORS as exc:
            self._storage_failed(exc, "housekeeping")
            return False, result
        self._retry_delay = self.settings.storage_retry_initial_seconds
        return True, result

    async def _idle_wait(self) -> None:
        self.summary.idle_waits += 1
        deadline = time.monotonic() + self.settings.idle_sleep_seconds
        while (remaining := deadline - time.monotonic()) > 0:
            timeout = remaining
            if self.heartbeat is not None:
                until = self.heartbeat.seconds_until_due(self.settings.heartbeat_seconds)
                timeout = min(timeout, max(until, 0.01))
            if self.listener is not None:
                await self.listener.ensure()
            woken = await self._wait(timeout, notify=True)
            if woken == "shutdown":
                return
            if woken == "notify":
                self.summary.wakeups += 1
                return
            if self.heartbeat is not None and self.heartbeat.due(self.settings.heartbeat_seconds):
                try:
                    await self.heartbeat.beat(self._details(), force=True)
                except STORAGE_ERRORS as exc:
                    self._storage_failed(exc, "heartbeat")

    async def _wait(self, seconds: float, *, notify: bool) -> str:
        """Wait for shutdown, a notification (if ``notify``) or ``seconds``; say which."""
        waiters = {asyncio.ensure_future(self.shutdown.wait()): "shutdown"}
        if notify and self.listener is not None and self.listener.listening:
            waiters[asyncio.ensure_future(self.listener.event.wait())] = "notify"
        try:
            done, _pending = await asyncio.wait(
                waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
        if not done:
            return "timeout"
        return "shutdown" if self.shutdown.is_set() else "notify"

    # -- housekeeping ----------------------------------------------------------
    async def _housekeeping(self, result: DispatchResult) -> None:
        now = time.monotonic()
        retention = self.settings.retention_seconds
        if (retention == 0 and result.published) or self._purge_backlog or now >= self._next_purge:
            self._next_purge = now + self.settings.housekeeping_seconds
            await self._purge(retention, result.published)
        keep_heartbeats = self.settings.heartbeat_retention_seconds
        if keep_heartbeats is not None and now >= self._next_heartbeat_purge:
            self._next_heartbeat_purge = now + self.settings.housekeeping_seconds
            await purge_heartbeats(
                self.engine, older_than=retention_cutoff(self.clock(), keep_heartbeats)
            )
        if self.metrics and now >= self._next_gauges:
            self._next_gauges = now + self.settings.housekeeping_seconds
            for metrics in self.metrics:
                await metrics.refresh_gauges(self.engine)
        if self.heartbeat is not None:
            await self.heartbeat.beat(self._details())

    async def _purge(self, retention: float | None, just_published: int) -> None:
        """The published rows past the retention, then the inbound ones past the inbox's
        dedup window when the local purge does not reach them (engine.operating.retention)."""
        batch = self.settings.retention_batch_size
        inbound = inbound_window(self.settings.inbound_retention_seconds)
        purged = 0
        full = False
        if retention is not None:
            # Bounded work per round: one batch, or (delete-on-publish) enough for this round.
            passes = max(1, math.ceil(just_published / batch)) if retention == 0 else 1
            for _ in range(passes):
                now = self.clock()
                count = await purge_published(
                    self.engine,
                    older_than=retention_cutoff(now, retention),
                    batch_size=batch,
                    inbound_older_than=retention_cutoff(now, inbound),
                )
                purged += count
                full = count >= batch
                if not full:
                    break
        if retention is None or inbound < retention:
            cutoff = retention_cutoff(self.clock(), inbound)
            count = await purge_inbound(self.engine, older_than=cutoff, batch_size=batch)
            purged += count
            full = full or count >= batch
        self._purge_backlog = full
        if purged:
            self.summary.purged += purged
            for metrics in self.metrics:
                metrics.observe_purged(purged)

    # -- storage errors --------------------------------------------------------
    def _storage_failed(self, exc: BaseException, during: str) -> None:
        self.summary.storage_errors += 1
        message = self._describe(exc)
        self.summary.last_error = message
        for metrics in self.metrics:
            metrics.observe_storage_error()
        retry = f", retrying in {self._retry_delay:.3g}s" if during != "heartbeat" else ""
        log.warning(
            "dispatcher %s: %s failed (storage error %d%s): %s",
            self.dispatcher.dispatcher_id,
            during,
            self.summary.storage_errors,
            retry,
            message,
        )

    def _storage_delay(self) -> float:
        delay = self._retry_delay
        self._retry_delay = min(delay * 2, self.settings.storage_retry_max_seconds)
        return delay

    def _describe(self, exc: BaseException) -> str:
        url = self.engine.url
        error = exc if isinstance(exc, StorageError) else translate_storage_error(exc, url)
        lines = str(error).strip().splitlines()
        return mask_secrets(lines[0] if lines else type(exc).__name__, url)

    # -- start and stop ----------------------------------------------------------
    async def _start(self) -> None:
        if self.settings.wakeup == "auto" and self.engine.dialect.name == "postgresql":
            self.listener = WakeupListener(self.engine, self.settings.wakeup_channel)
            await self.listener.start()
        if self.heartbeat is not None:
            try:
                await self.heartbeat.beat(self._details(), force=True)
            except STORAGE_ERRORS as exc:
                self._storage_failed(exc, "heartbeat")
        await await_ready_hooks(self.dispatcher.registry)

    async def _stop(self) -> None:
        try:
            await self.dispatcher.release_prefetched()
        except Exception as exc:  # leases expire; cleanup must not hide the outcome
            if isinstance(exc, STORAGE_ERRORS):
                self.summary.storage_errors += 1
            log.warning(
                "dispatcher %s: could not hand back the batch claimed ahead or write the "
                "last outcomes of the rounds finishing behind: %s",
                self.dispatcher.dispatcher_id,
                self._describe(exc),
            )
        self.summary.add(await self.dispatcher.report_unreported())
        if self.listener is not None:
            try:
                await self.listener.close()
            except Exception as exc:  # cleanup must not hide the loop's own outcome
                log.warning("wake-up listener did not close cleanly: %s", self._describe(exc))
        if self.heartbeat is not None:
            try:
                await self.heartbeat.stop(self._details())
            except Exception as exc:
                log.warning(
                    "dispatcher %s: could not mark heartbeat %s stopped: %s",
                    self.dispatcher.dispatcher_id,
                    self.heartbeat.instance_id,
                    self._describe(exc),
                )

    def _details(self) -> dict[str, Any]:
        s = self.summary
        return {
            "dispatcher_id": self.dispatcher.dispatcher_id,
            "iterations": s.iterations,
            "totals": s.totals(),
            "batch_size": self.dispatcher.batch_size,
            "max_concurrency": self.dispatcher.max_concurrency,
            "idle_sleep_seconds": self.settings.idle_sleep_seconds,
            "heartbeat_seconds": self.settings.heartbeat_seconds,
            "wakeup": "notify" if self.listener is not None and self.listener.listening else "poll",
            "use_lock": self.dispatcher.lock_provider is not None,
            "last_error": s.last_error,
            "waiting_for": self.dispatcher.waiting_for,
            # What it claims: operators see which types no running dispatcher serves.
            "serves": self.dispatcher.served_types,
            # The last minute's lag, by bucket, when this process measures it (metrics).
            **({"lag": self.metrics[0].lag_window.as_details()} if self.metrics else {}),
        }
