"""SQLite connections and aiosqlite's worker threads.

aiosqlite runs each connection on a thread of its own. When a connect fails it queues that
thread's stop and raises at once; if the program's event loop closes before the thread
hands back the stop's result, Python prints an "Event loop is closed" traceback from the
thread at exit. ``create_engine``'s connector returns from a failed connect only once the
thread has stopped, and marks every worker thread daemon, as SQLAlchemy's own does.

Each statement is one trip to that thread: the statement, its first rows and the cursor's
close, where SQLAlchemy's adapter over plain aiosqlite made four.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from engine import create_engine
from engine.storage.aiosqlite_connect import FIRST_ROWS
from engine.storage.database import SQLITE_BUSY_TIMEOUT_SECONDS, waiting_at_most


def _workers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if "_connection_worker_thread" in t.name}


async def test_a_failed_connect_has_stopped_its_worker_thread_when_it_raises(
    tmp_path: Path,
) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/outbox.db")
    before = _workers()
    try:
        for _ in range(3):
            with pytest.raises(OperationalError, match="unable to open database file"):
                async with engine.connect():
                    pass
            assert {t for t in _workers() - before if t.is_alive()} == set()
    finally:
        await engine.dispose()


async def test_a_connection_runs_on_a_daemon_thread(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path}/outbox.db")
    before = _workers()
    try:
        async with engine.connect() as conn:
            assert (await conn.exec_driver_sql("SELECT 1")).scalar() == 1
            [worker] = _workers() - before
            assert worker.daemon
    finally:
        await engine.dispose()


# -- one trip to the worker thread per statement -------------------------------------------


class _Trips:
    """Counts the calls queued to aiosqlite's worker threads (each is a trip there and back)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = aiosqlite.Connection._execute

        async def counted(connection: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await real(connection, fn, *args, **kwargs)

        monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)


@pytest.fixture
async def sqlite_engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path}/outbox.db")
    async with engine.begin() as conn:
        await conn.exec_driver_sql("CREATE TABLE t (n INTEGER PRIMARY KEY, label TEXT)")
    try:
        yield engine
    finally:
        await engine.dispose()


async def _fill(conn: AsyncConnection, rows: int) -> None:
    await conn.execute(
        text("INSERT INTO t (n, label) VALUES (:n, :label)"),
        [{"n": n, "label": f"row {n}"} for n in range(rows)],
    )


async def test_a_statement_and_its_rows_take_one_trip_to_the_thread(
    sqlite_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with sqlite_engine.begin() as conn:
        await _fill(conn, 10)
        trips = _Trips(monkeypatch)
        rows = (await conn.execute(text("SELECT n, label FROM t ORDER BY n"))).all()
        assert [tuple(r) for r in rows] == [(n, f"row {n}") for n in range(10)]
        assert trips.count == 1
        changed = await conn.execute(text("UPDATE t SET label = 'x' WHERE n < 4"))
        assert changed.rowcount == 4
        assert trips.count == 2


async def test_a_result_longer_than_the_first_trip_comes_back_whole_and_in_order(
    sqlite_engine: AsyncEngine,
) -> None:
    many = 2 * FIRST_ROWS + 7
    async with sqlite_engine.begin() as conn:
        await _fill(conn, many)
        rows = (await conn.execute(text("SELECT n FROM t ORDER BY n"))).scalars().all()
        assert rows == list(range(many))
        # RETURNING rows count as they are read: rowcount covers all of them.
        updated = await conn.execute(text("UPDATE t SET label = 'y' RETURNING n"))
        assert sorted(updated.scalars().all()) == list(range(many))
        assert updated.rowcount == many


async def test_a_streamed_result_is_read_in_parts_and_a_closed_one_frees_the_table(
    sqlite_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    many = 3 * FIRST_ROWS
    async with sqlite_engine.begin() as conn:
        await _fill(conn, many)
    async with sqlite_engine.connect() as conn:
        trips = _Trips(monkeypatch)
        streamed = await conn.stream(text("SELECT n FROM t ORDER BY n"))
        seen = [n async for n in streamed.scalars()]
        assert seen == list(range(many))
        assert trips.count > 1  # the rows past the first trip's came in later trips
        partial = await conn.stream(text("SELECT n FROM t ORDER BY n"))
        assert (await partial.fetchmany(5)) == [(n,) for n in range(5)]
        await partial.close()
        await conn.commit()
        # A statement still open on the table would make SQLite refuse to drop it.
        await conn.exec_driver_sql("DROP TABLE t")
        await conn.commit()


async def test_errors_are_sqlalchemys_and_leave_the_connection_usable(
    sqlite_engine: AsyncEngine,
) -> None:
    async with sqlite_engine.connect() as conn:
        with pytest.raises(OperationalError, match="no such table"):
            await conn.exec_driver_sql("SELECT * FROM missing")
        await conn.rollback()
        await _fill(conn, 1)
        with pytest.raises(IntegrityError, match="UNIQUE"):
            await _fill(conn, 1)
        await conn.rollback()
        inserted = await conn.execute(text("INSERT INTO t (label) VALUES ('auto')"))
        assert inserted.lastrowid is not None
        assert (await conn.exec_driver_sql("SELECT count(*) FROM t")).scalar() == 1


async def test_a_write_transaction_with_a_bounded_wait_costs_no_trips_of_its_own(
    sqlite_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    claimer = waiting_at_most(sqlite_engine, 5)
    async with claimer.begin():  # a connection in the pool, so none is opened below
        pass
    trips = _Trips(monkeypatch)
    async with claimer.begin() as conn:
        await _fill(conn, 1)
    # BEGIN with its PRAGMAs, the statement, COMMIT; the pool's rollback costs none.
    assert trips.count == 3
    async with sqlite_engine.connect() as conn:
        usual = (await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar()
        assert usual == SQLITE_BUSY_TIMEOUT_SECONDS * 1000


async def test_a_statement_cancelled_mid_trip_leaves_the_engine_usable(
    sqlite_engine: AsyncEngine,
) -> None:
    slow = text(
        "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 1000000) "
        "SELECT count(*) FROM c"
    )
    async with sqlite_engine.connect() as conn:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await conn.execute(slow)
    # The thread finishes the statement; the connection goes back (rolled back) behind it.
    async with sqlite_engine.begin() as conn:
        await _fill(conn, 3)
    async with sqlite_engine.connect() as conn:
        assert (await conn.exec_driver_sql("SELECT count(*) FROM t")).scalar() == 3
