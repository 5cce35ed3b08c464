"""PostgreSQL wake-up: producers notify after commit, idle dispatchers LISTEN.

The listener uses asyncpg's listener callbacks, or on psycopg a task waiting in the
connection's ``notifies()`` (engine.storage.psycopg_paths.NotificationPump).

A dispatcher with nothing to do sleeps ``idle_sleep_seconds``; on PostgreSQL it
also LISTENs on a channel (``outbox_events`` by default) and starts its next
round as soon as a notification arrives, whichever comes first.

Why the notification is not sent inside the business transaction: a
transaction that has called NOTIFY takes a cluster-wide lock at commit to
append to the notification queue, so every notifying commit is serialised
behind every other. A trigger (or an in-transaction ``pg_notify``) on the
outbox table puts that lock on every producer's commit. Here, instead, the
publisher marks the session when it wrote outbox rows, and after the commit a
per-process ``CommitNotifier`` sends one ``pg_notify`` on its own autocommit
connection, coalesced: the first commit after a quiet period notifies at once
(low latency), later commits within ``interval_ms`` share one trailing
notification. A producer process therefore sends at most ~1000/interval_ms
notifications a second whatever its commit rate, and a business commit never
waits for the notification lock. benchmarks/notify_commit_rate.py measures the
three designs; decision 0015 has the figures.

Producers that do not use this engine (another language, plain SQL) can run
``SELECT pg_notify('outbox_events', '')`` after their commit, or rely on the
dispatchers' idle sleep. A lost notification (the listener was reconnecting)
costs at most one idle sleep of latency, never an event: notifications only
shorten a sleep, the claim query still decides what is due.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.orm import Session

from engine.settings import DispatcherSettings
from engine.storage.drivers import is_psycopg
from engine.storage.psycopg_paths import NotificationPump
from engine.storage.secrets import mask_secrets
from engine.writing.publisher import SESSION_EVENTS_WRITTEN

DEFAULT_CHANNEL = "outbox_events"
DEFAULT_INTERVAL_MS = 100.0

log = logging.getLogger("engine.wakeup")


class WakeupListener:
    """LISTENs on ``channel`` over a dedicated connection; ``event`` is set per notification.

    If the connection cannot be opened or breaks, ``ensure`` retries at most
    every ``retry_seconds``; meanwhile the dispatcher simply polls.
    """

    def __init__(
        self, engine: AsyncEngine, channel: str = DEFAULT_CHANNEL, *, retry_seconds: float = 5.0
    ) -> None:
        self.engine = engine
        self.channel = channel
        self.retry_seconds = retry_seconds
        self.event = asyncio.Event()
        self.notifications = 0
        self._conn: AsyncConnection | None = None
        self._driver: Any = None
        self._next_attempt = 0.0
        self._failures = 0

    @property
    def listening(self) -> bool:
        return self._driver is not None and not self._driver.is_closed()

    async def start(self) -> bool:
        """Open the connection and LISTEN; False (logged) when that failed."""
        self._next_attempt = time.monotonic() + self.retry_seconds
        try:
            conn = await self.engine.connect()
        except Exception as exc:
            self._failed("cannot connect", exc)
            return False
        try:
            driver: Any
            if is_psycopg(conn.dialect):
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                raw = await conn.get_raw_connection()
                driver = NotificationPump(
                    raw.driver_connection, self.channel, self._on_notification
                )
                await driver.start()
            else:
                raw = await conn.get_raw_connection()
                driver = raw.driver_connection
                await driver.add_listener(self.channel, self._on_notification)
        except Exception as exc:
            self._failed("LISTEN failed", exc)
            await _discard(conn)
            return False
        if self._failures:
            log.info("wake-up listener: listening on %s again", self.channel)
        self._failures = 0
        self._conn, self._driver = conn, driver
        return True

    def _failed(self, what: str, exc: BaseException) -> None:
        # One warning per outage; the retries every retry_seconds log at debug level.
        level = logging.WARNING if self._failures == 0 else logging.DEBUG
        self._failures += 1
        log.log(level, "wake-up listener: %s (polling meanwhile): %s", what, self._line(exc))

    async def ensure(self) -> None:
        """Reconnect a broken listener, at most every ``retry_seconds``."""
        if self.listening or time.monotonic() < self._next_attempt:
            return
        await self.close()
        await self.start()

    def clear(self) -> None:
        self.event.clear()

    async def close(self) -> None:
        conn, driver = self._conn, self._driver
        self._conn = self._driver = None
        if conn is None:
            return
        # The connection returns to no pool: it carried LISTEN state and a listener callback.
        try:
            if not driver.is_closed():
                await driver.remove_listener(self.channel, self._on_notification)
        except Exception as exc:  # broken already; the invalidation below frees it
            log.debug("wake-up listener: UNLISTEN failed: %s", exc)
        await _discard(conn)

    def _on_notification(self, *_args: Any) -> None:
        self.notifications += 1
        self.event.set()

    def _line(self, exc: BaseException) -> str:
        text_ = str(exc).strip().splitlines()
        return mask_secrets(text_[0] if text_ else type(exc).__name__, self.engine.url)


class CommitNotifier:
    """Sends coalesced ``pg_notify`` after commits that wrote outbox rows (one per process).

    Create it with ``enable_commit_notifications`` at producer start-up and
    ``await aclose()`` it at shutdown. ``sent`` counts notifications sent.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        channel: str = DEFAULT_CHANNEL,
        interval_ms: float = DEFAULT_INTERVAL_MS,
    ) -> None:
        if engine.dialect.name != "postgresql":
            raise ValueError("commit notifications need PostgreSQL")
        self.engine = engine
        self.channel = channel
        self.interval = interval_ms / 1000.0
        self.sent = 0
        self._url: URL = engine.url
        self._dirty = False
        self._task: asyncio.Task[None] | None = None
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            event.listen(Session, "after_commit", self._after_commit)
            event.listen(Session, "after_rollback", self._after_rollback)
            self._installed = True

    def poke(self) -> None:
        """Ask for a notification; sent now if none was sent in the last interval."""
        self._dirty = True
        if self._task is None or self._task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # a synchronous session outside any event loop
                self._dirty = False
                return
            self._task = loop.create_task(self._run(), name="outbox-commit-notifier")

    async def flush(self) -> None:
        """Wait until every requested notification has been sent."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def aclose(self) -> None:
        """Remove the commit hooks and stop the sender (pending notifications are dropped)."""
        if self._installed:
            event.remove(Session, "after_commit", self._after_commit)
            event.remove(Session, "after_rollback", self._after_rollback)
            self._installed = False
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> CommitNotifier:
        self.install()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    def _after_commit(self, session: Session) -> None:
        if not session.info.pop(SESSION_EVENTS_WRITTEN, False):
            return
        bind = session.bind
        if bind is not None and bind.engine.url == self._url:
            self.poke()

    def _after_rollback(self, session: Session) -> None:
        session.info.pop(SESSION_EVENTS_WRITTEN, None)

    async def _run(self) -> None:
        while self._dirty:
            self._dirty = False
            await self._send()
            if self.interval > 0:
                await asyncio.sleep(self.interval)

    async def _send(self) -> None:
        try:
            async with self.engine.connect() as conn:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(
                    text("SELECT pg_notify(:channel, '')"), {"channel": self.channel}
                )
            self.sent += 1
        except Exception as exc:  # dispatchers fall back on their idle sleep
            line = str(exc).strip().splitlines()
            log.warning(
                "outbox wake-up notification failed: %s",
                mask_secrets(line[0] if line else type(exc).__name__, self._url),
            )


def enable_commit_notifications(
    engine: AsyncEngine,
    *,
    channel: str = DEFAULT_CHANNEL,
    interval_ms: float = DEFAULT_INTERVAL_MS,
) -> CommitNotifier:
    """Notify idle dispatchers after every commit that wrote outbox events on ``engine``."""
    notifier = CommitNotifier(engine, channel=channel, interval_ms=interval_ms)
    notifier.install()
    return notifier


def commit_notifier_for(engine: AsyncEngine, settings: DispatcherSettings) -> CommitNotifier | None:
    """The producer side of wake-up as ``settings`` say, installed; None on SQLite or ``off``."""
    if settings.wakeup == "off" or engine.dialect.name != "postgresql":
        return None
    return enable_commit_notifications(
        engine, channel=settings.wakeup_channel, interval_ms=settings.notify_interval_ms
    )


async def _discard(conn: AsyncConnection) -> None:
    try:
        await conn.invalidate()
        await conn.close()
    except Exception as exc:
        log.debug("wake-up: discarding a connection failed: %s", exc)
