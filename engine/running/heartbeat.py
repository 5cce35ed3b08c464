"""A running process's row in ``process_heartbeats``: alive, stale or stopped.

The run loop calls ``beat`` after every round; the row is upserted (one small
statement, never per event) at most once per ``min_interval`` seconds while
the loop is busy, so a dispatcher doing hundreds of rounds a second writes one
heartbeat a second. While idle, the loop wakes for a heartbeat at least every
``heartbeat_seconds`` even if its idle sleep is longer. ``stop`` marks the row
``stopped`` with ``stopped_at`` on a clean exit, after a shutdown request and
when an exception escapes the loop; a process killed outright leaves a
``running`` row whose ``last_seen_at`` ages, which readers call stale.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.clock import Clock, utc_now
from engine.storage.database import DISPATCHER_BUSY_TIMEOUT_SECONDS, waiting_at_most
from engine.storage.schema import process_heartbeats

RUNNING = "running"
STOPPED = "stopped"

hb = process_heartbeats


class Heartbeat:
    """Upserts one process's heartbeat row; ``writes`` counts the statements sent."""

    def __init__(
        self,
        engine: AsyncEngine,
        instance_id: str,
        *,
        kind: str = "dispatcher",
        min_interval: float = 1.0,
        clock: Clock = utc_now,
        host: str | None = None,
        pid: int | None = None,
    ) -> None:
        if not instance_id:
            raise ValueError("a heartbeat needs a non-empty instance_id")
        self.engine = engine
        # On SQLite a heartbeat waits a few seconds at most for the write lock: a stop is
        # not held up by another process's long transaction (a beat that fails is retried).
        self._writer = waiting_at_most(engine, DISPATCHER_BUSY_TIMEOUT_SECONDS)
        self.instance_id = instance_id
        self.kind = kind
        self.min_interval = min_interval
        self.host = host or socket.gethostname()
        self.pid = os.getpid() if pid is None else pid
        self._clock = clock
        self.started_at: datetime = clock()
        self.writes = 0
        self._last_attempt: float | None = None  # monotonic; failures count, so no busy retry

    def due(self, within: float | None = None) -> bool:
        """True when the last attempt is at least ``within`` (default min_interval) seconds old."""
        if self._last_attempt is None:
            return True
        limit = self.min_interval if within is None else within
        return time.monotonic() - self._last_attempt >= limit

    def seconds_until_due(self, within: float) -> float:
        if self._last_attempt is None:
            return 0.0
        return max(0.0, within - (time.monotonic() - self._last_attempt))

    async def beat(self, details: Mapping[str, Any], *, force: bool = False) -> bool:
        """Upsert the row as running unless throttled; returns whether it was written."""
        if not force and not self.due():
            return False
        await self._upsert(RUNNING, details, stopped_at=None)
        return True

    async def stop(self, details: Mapping[str, Any]) -> None:
        """Mark the row stopped (always written)."""
        await self._upsert(STOPPED, details, stopped_at=self._clock())

    async def _upsert(
        self, state: str, details: Mapping[str, Any], *, stopped_at: datetime | None
    ) -> None:
        now = self._clock()
        values = {
            "instance_id": self.instance_id,
            "kind": self.kind,
            "host": self.host,
            "pid": self.pid,
            "state": state,
            "started_at": self.started_at,
            "last_seen_at": now,
            "stopped_at": stopped_at,
            "details": dict(details),
        }
        self._last_attempt = time.monotonic()
        async with self._writer.begin() as conn:
            insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(hb)
            stmt = insert.values(values).on_conflict_do_update(
                index_elements=[hb.c.instance_id],
                set_={k: insert.excluded[k] for k in values if k != "instance_id"},
            )
            await conn.execute(stmt)
        self.writes += 1
