"""Opening aiosqlite connections for SQLAlchemy: ``create_engine``'s connector on SQLite.

The connection it returns runs each statement in one trip to aiosqlite's worker thread.
SQLAlchemy's adapter drives a statement as four awaits on aiosqlite (open a cursor,
execute, fetch the rows, close the cursor), and every await is a trip to that thread and
back: a thread wake-up, then the event loop's. A dispatcher round on SQLite runs about ten
statements, so the trips cost more than the SQL (see decision 0022). Here the cursor opens
without a trip, and ``execute`` runs the statement, fetches its first rows and closes what
is done, in one. A transaction's BEGIN (with the PRAGMAs of a bounded wait for the write
lock) is one trip too, and the pool's rollback of a connection it takes back is none when
no transaction is open.
"""

from __future__ import annotations

import asyncio
import collections
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import aiosqlite

# How long a failed connect waits for aiosqlite's worker thread to stop.
_WORKER_STOP_SECONDS = 1.0
# Rows fetched in the statement's own trip; more (a large result) take one trip more each
# time they are read, so a streamed result still holds at most this many in memory.
FIRST_ROWS = 1000


async def connect_aiosqlite(*args: Any, **kwargs: Any) -> OneTripConnection:
    """``aiosqlite.connect``, one trip a statement, that, when the connect fails, returns
    only once the connection's worker thread has stopped.

    On a failed connect aiosqlite queues its thread's stop and raises at once; the thread
    then hands the stop's result to the event loop. A program that ends right after such
    a failure (an unopenable file, then a stop) has closed its loop by then, and Python
    prints the thread's "Event loop is closed" traceback at exit (omnilib/aiosqlite#241).
    """
    connection = aiosqlite.connect(*args, **kwargs)
    # Before aiosqlite 0.22 the connection was the thread; since, it holds one (SQLAlchemy's
    # own connector reads both the same way).
    worker = (
        connection
        if isinstance(connection, threading.Thread)
        else getattr(connection, "_thread", None)
    )
    if worker is not None:
        worker.daemon = True  # as SQLAlchemy sets it: a leaked connection never holds exit
    try:
        return OneTripConnection(await connection)
    except Exception:
        if worker is not None:  # the loop stays open (and takes the stop's result) meanwhile
            await asyncio.to_thread(worker.join, _WORKER_STOP_SECONDS)
        raise


class OneTripConnection:
    """An aiosqlite connection whose cursors take one trip to its thread per statement.

    Beside ``cursor()``, ``begin`` and ``rollback`` are its own; everything else is
    aiosqlite's (SQLAlchemy's adapter also reaches into its queue and its sqlite3
    connection, so those stay reachable as they were). Work in the thread goes through
    ``_in_thread``.
    """

    def __init__(self, connection: aiosqlite.Connection) -> None:
        self._aiosqlite = connection

    def __getattr__(self, name: str) -> Any:
        return getattr(self._aiosqlite, name)

    def cursor(self) -> _Opening:
        return _Opening(self._aiosqlite)

    async def rollback(self) -> None:
        """Roll back, with no trip when no transaction is open: SQLAlchemy's pool rolls
        back every connection it takes back, after a commit too (sqlite3's own rollback
        does nothing then, and the flag it reads is the one read here)."""
        if self._aiosqlite._conn.in_transaction:
            await self._aiosqlite.rollback()

    async def begin(self, mode: str, busy_timeout: float | None, usual: float) -> None:
        """``BEGIN <mode>`` in one trip; with ``busy_timeout`` (seconds), waiting at most
        that long for the write lock, after which the ``usual`` busy timeout is back (also
        when the wait ran out). Three statements, one trip: a dispatcher's claim begins so.
        """
        await _in_thread(self._aiosqlite, self._begin, f"BEGIN {mode}", busy_timeout, usual)

    def _begin(self, begin: str, busy_timeout: float | None, usual: float) -> None:
        connection = self._aiosqlite._conn
        if busy_timeout is None:
            connection.execute(begin).close()
            return
        connection.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}").close()
        try:
            connection.execute(begin).close()
        finally:
            connection.execute(f"PRAGMA busy_timeout={int(usual * 1000)}").close()


async def _in_thread(
    connection: aiosqlite.Connection, work: Callable[..., None], *args: Any
) -> None:
    """Run ``work`` on the connection's thread through aiosqlite's ``_execute``: the one
    queue that keeps every call on the connection in order."""
    await connection._execute(work, *args)  # type: ignore[no-untyped-call]


class _Opening:
    """What ``cursor()`` returns: awaited (``async with`` or ``__aenter__``, as SQLAlchemy
    and aiosqlite callers do), it is the cursor, with no trip to the thread."""

    def __init__(self, connection: aiosqlite.Connection) -> None:
        self._cursor = OneTripCursor(connection)

    def __await__(self) -> Any:
        return self.__aenter__().__await__()

    async def __aenter__(self) -> OneTripCursor:
        return self._cursor

    async def __aexit__(self, *exc_info: object) -> None:
        await self._cursor.close()


class OneTripCursor:
    """A DB-API cursor over aiosqlite whose ``execute`` is one trip to the thread.

    The statement's first ``FIRST_ROWS`` rows come back with it, and so do its
    ``description``, ``rowcount`` and ``lastrowid``. A result that ends within them is
    closed in that trip; a longer one keeps its sqlite3 cursor open in the thread
    until it is read to the end or closed.
    """

    def __init__(self, connection: aiosqlite.Connection) -> None:
        self._connection = connection
        self._open: sqlite3.Cursor | None = None  # a result not read to its end yet
        self._rows: collections.deque[Any] = collections.deque()
        self.description: Any = None
        self.rowcount = -1
        self.lastrowid: int | None = None
        self.arraysize = 1

    async def execute(self, sql: str, parameters: Any = ()) -> OneTripCursor:
        await self.close()
        await _in_thread(self._connection, self._run, sql, parameters)
        return self

    async def executemany(self, sql: str, parameters: Iterable[Any]) -> OneTripCursor:
        await self.close()
        await _in_thread(self._connection, self._run_many, sql, parameters)
        return self

    async def fetchone(self) -> Any:
        if not self._rows and self._open is not None:
            await _in_thread(self._connection, self._fetch, 1)
        return self._rows.popleft() if self._rows else None

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        wanted = self.arraysize if size is None else size
        if len(self._rows) < wanted and self._open is not None:
            await _in_thread(self._connection, self._fetch, wanted - len(self._rows))
        return [self._rows.popleft() for _ in range(min(wanted, len(self._rows)))]

    async def fetchall(self) -> list[Any]:
        if self._open is not None:
            await _in_thread(self._connection, self._fetch, None)
        rows = list(self._rows)
        self._rows.clear()
        return rows

    async def close(self) -> None:
        self._rows.clear()
        if self._open is not None:
            await _in_thread(self._connection, self._close)

    async def __aenter__(self) -> OneTripCursor:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- in the connection's thread ------------------------------------------------------

    def _run(self, sql: str, parameters: Any) -> None:
        cursor = self._connection._conn.cursor()
        try:
            cursor.execute(sql, parameters)
            self.description = cursor.description
            self._open = cursor
            if cursor.description is not None:
                self._fetch_into(cursor, FIRST_ROWS)
            else:
                self._close()
        except BaseException:
            self._open = None
            cursor.close()
            raise
        self.rowcount, self.lastrowid = cursor.rowcount, cursor.lastrowid

    def _run_many(self, sql: str, parameters: Iterable[Any]) -> None:
        cursor = self._connection._conn.cursor()
        try:
            cursor.executemany(sql, parameters)
            self.description = cursor.description
            self.rowcount, self.lastrowid = cursor.rowcount, cursor.lastrowid
        finally:
            cursor.close()

    def _fetch(self, count: int | None) -> None:
        cursor = self._open
        assert cursor is not None
        self._fetch_into(cursor, count)
        # RETURNING rows count as they are read: the total is known once all are.
        self.rowcount, self.lastrowid = cursor.rowcount, cursor.lastrowid

    def _fetch_into(self, cursor: sqlite3.Cursor, count: int | None) -> None:
        rows: Sequence[Any] = cursor.fetchall() if count is None else cursor.fetchmany(count)
        self._rows.extend(rows)
        if count is None or len(rows) < count:
            self._close()

    def _close(self) -> None:
        cursor, self._open = self._open, None
        if cursor is not None:
            cursor.close()
