"""Coarse cross-process locks around a dispatcher's claim round (optional).

``use_lock`` makes dispatchers take turns: only the holder of the
``outbox:dispatch`` lock claims in a round, the others return an empty round.
That reduces contention (and keeps strict claim order across processes), but
it is not what makes the outbox correct: claims are conditional single
statements and every completion is fenced by the claim's token, so two
dispatchers that both believe they hold the lock (an expired lease, a network
partition) still never complete one event twice.

* PostgreSQL: a session-level advisory lock, ``pg_try_advisory_lock(key)``,
  held on a dedicated connection for the round and released (or the
  connection discarded) afterwards. ``key`` is a stable signed 64-bit number
  derived from the lock name with BLAKE2b, so every process and every
  PostgreSQL version agree on it.
* SQLite (and any database): a lease row in ``outbox_locks`` taken with one
  conditional upsert that succeeds only when the row is free, expired or
  already ours. A holder that dies leaves the row to expire after ``lease``.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from engine.clock import Clock, utc_now
from engine.dispatch import LockProvider
from engine.storage.schema import locks

DISPATCH_LOCK = "outbox:dispatch"

log = logging.getLogger("engine.locks")


def advisory_key(name: str) -> int:
    """A stable signed 64-bit advisory lock key for ``name``."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PostgresAdvisoryLock:
    """A session-level advisory lock held on its own connection between acquire and release."""

    def __init__(self, engine: AsyncEngine, name: str = DISPATCH_LOCK) -> None:
        self.engine = engine
        self.name = name
        self.key = advisory_key(name)
        self._conn: AsyncConnection | None = None

    @property
    def held(self) -> bool:
        return self._conn is not None

    async def acquire(self) -> bool:
        if self._conn is not None:
            return True
        conn = await self.engine.connect()
        try:
            # Autocommit: the lock belongs to the session, so no transaction idles open.
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            got = (
                await conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": self.key})
            ).scalar_one()
        except BaseException:
            await _discard(conn)
            raise
        if not got:
            await conn.close()
            return False
        self._conn = conn
        return True

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            await conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self.key})
        except BaseException:
            # A broken session's locks die with it; never pool a connection that may hold one.
            await _discard(conn)
            raise
        await conn.close()


class LeaseLock:
    """A lease row in ``outbox_locks`` (name, holder, expires_at); works on every backend."""

    def __init__(
        self,
        engine: AsyncEngine,
        name: str = DISPATCH_LOCK,
        *,
        holder: str | None = None,
        lease_seconds: float = 30.0,
        clock: Clock = utc_now,
    ) -> None:
        self.engine = engine
        self.name = name
        # Unique per provider: two dispatchers sharing a dispatcher id must still exclude.
        self.holder = f"{holder or 'dispatcher'}#{uuid.uuid4().hex[:8]}"
        self.lease = timedelta(seconds=lease_seconds)
        self._clock = clock

    async def acquire(self) -> bool:
        now = self._clock()
        async with self.engine.begin() as conn:
            insert: Any = (
                postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
            )(locks)
            stmt = (
                insert.values(name=self.name, holder=self.holder, expires_at=now + self.lease)
                .on_conflict_do_update(
                    index_elements=[locks.c.name],
                    set_={
                        "holder": insert.excluded.holder,
                        "expires_at": insert.excluded.expires_at,
                    },
                    where=(locks.c.holder == self.holder) | (locks.c.expires_at <= now),
                )
                .returning(locks.c.holder)
            )
            return (await conn.execute(stmt)).first() is not None

    async def release(self) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                delete(locks).where(locks.c.name == self.name, locks.c.holder == self.holder)
            )


def lock_provider_for(
    engine: AsyncEngine,
    *,
    name: str = DISPATCH_LOCK,
    holder: str | None = None,
    lease_seconds: float = 30.0,
    clock: Clock = utc_now,
) -> LockProvider:
    """The advisory lock on PostgreSQL, the lease row elsewhere."""
    if engine.dialect.name == "postgresql":
        return PostgresAdvisoryLock(engine, name)
    return LeaseLock(engine, name, holder=holder, lease_seconds=lease_seconds, clock=clock)


async def _discard(conn: AsyncConnection) -> None:
    try:
        await conn.invalidate()
        await conn.close()
    except Exception as exc:  # already broken; nothing more to free
        log.debug("discarding lock connection failed: %s", exc)
