"""``begin_promptly``: a write that waits for SQLite's lock by polling, not the busy handler.

How much sooner it gets the lock is measured by the fault suite (the side-effect window in
docs/RELIABILITY.md), never timed here; these tests pin what it must do besides.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from engine import create_engine
from engine.storage.database import SQLITE_BUSY_TIMEOUT_SECONDS, begin_promptly


async def _rows(url: str) -> list[int]:
    reader = create_engine(url)
    try:
        async with reader.connect() as conn:
            return [r[0] for r in await conn.execute(text("SELECT x FROM t ORDER BY x"))]
    finally:
        await reader.dispose()


@pytest.fixture
async def two_engines(database_url: str):  # type: ignore[no-untyped-def]
    holder, waiter = create_engine(database_url), create_engine(database_url)
    async with holder.begin() as conn:
        await conn.execute(text("CREATE TABLE t (x INTEGER)"))
    try:
        yield holder, waiter, database_url
    finally:
        await holder.dispose()
        await waiter.dispose()


async def test_commits_after_a_held_write_lock_is_released(two_engines) -> None:  # type: ignore[no-untyped-def]
    holder, waiter, url = two_engines
    held = asyncio.Event()

    async def hold() -> None:
        async with holder.begin() as conn:
            await conn.execute(text("INSERT INTO t VALUES (1)"))
            held.set()
            await asyncio.sleep(0.3)

    holding = asyncio.create_task(hold())
    await held.wait()
    async with begin_promptly(waiter) as conn:
        await conn.execute(text("INSERT INTO t VALUES (2)"))
    await holding
    assert await _rows(url) == [1, 2]


async def test_an_error_inside_rolls_back(two_engines) -> None:  # type: ignore[no-untyped-def]
    _holder, waiter, url = two_engines
    with pytest.raises(RuntimeError):
        async with begin_promptly(waiter) as conn:
            await conn.execute(text("INSERT INTO t VALUES (3)"))
            raise RuntimeError("handler code failed")
    assert await _rows(url) == []


async def test_sqlite_gives_up_after_the_busy_timeout_and_keeps_its_busy_timeout(
    sqlite_url: str,
) -> None:
    holder, waiter = create_engine(sqlite_url), create_engine(sqlite_url)
    try:
        async with holder.begin() as conn:
            await conn.execute(text("CREATE TABLE t (x INTEGER)"))
        async with holder.begin() as conn:
            await conn.execute(text("INSERT INTO t VALUES (1)"))
            with pytest.raises(OperationalError, match="locked"):
                async with begin_promptly(waiter, wait_seconds=0.2) as other:
                    await other.execute(text("INSERT INTO t VALUES (2)"))
        # The connection that polled went back to the pool with the usual busy timeout.
        async with waiter.connect() as conn:
            timeout = (await conn.execute(text("PRAGMA busy_timeout"))).scalar_one()
        assert timeout == int(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)
        assert await _rows(sqlite_url) == [1]
    finally:
        await holder.dispose()
        await waiter.dispose()
