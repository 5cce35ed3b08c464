"""A thread of its own that commits rows of one SQLite statement, many a transaction.

For writes that must land as soon as possible whatever the event loop is doing (a side
effect's record: until it commits, a crash makes the external call again). The rows go
to the thread as they are handed over; the thread commits everything that arrived while
its previous commit ran, so the time from a hand-over to its commit does not wait for
the event loop's next turn, which a loop running a hundred handlers makes long. The
write lock is held for the SQL alone, and polled for every millisecond (SQLite's busy
handler sleeps up to 100 ms between tries, through a free lock). See decision 0037.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

# How often the thread tries for the write lock while another writer holds it.
LOCK_POLL_SECONDS = 0.001
# A thread with nothing to write for this long closes its connection and ends.
IDLE_SECONDS = 1.0

Row = tuple[Any, ...]
Waiting = tuple[Row, asyncio.Future[None]]


class SqliteBatchWriter:
    """Commits ``sql`` once per row handed to ``submit``, in batches, on a thread.

    ``connect`` opens the thread's connection (``sqlite3.connect`` with the engine's
    arguments). Each future is done once its row is committed, or fails with
    ``translate(error)``. A batch the database refuses is written again one row at a
    time, so a refused row fails only its own future. The lock is waited for at most
    ``lock_wait_seconds``.
    """

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        sql: str,
        *,
        lock_wait_seconds: float,
        translate: Callable[[Exception], BaseException],
    ) -> None:
        self._connect = connect
        self._sql = sql
        self._lock_wait_seconds = lock_wait_seconds
        self._translate = translate
        self._changed = threading.Condition()
        self._waiting: list[Waiting] = []
        self._thread: threading.Thread | None = None

    def submit(self, row: Row, done: asyncio.Future[None]) -> None:
        """Hand ``row`` to the thread; ``done`` (of the running loop) tells its commit."""
        with self._changed:
            self._waiting.append((row, done))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="outbox-sqlite-batches", daemon=True
                )
                self._thread.start()
            else:
                self._changed.notify()

    def _run(self) -> None:
        try:
            connection = self._connect()
        except Exception as exc:
            with self._changed:
                waiting, self._waiting, self._thread = self._waiting, [], None
            _settle(waiting, self._translate(exc))
            return
        try:
            connection.execute("PRAGMA busy_timeout=0").close()  # the lock is polled for
            while True:
                with self._changed:
                    if not self._waiting:
                        self._changed.wait(IDLE_SECONDS)
                    if not self._waiting:
                        self._thread = None  # the next submit starts another
                        return
                    batch, self._waiting = self._waiting, []
                self._commit(connection, batch)
        finally:
            connection.close()

    def _commit(self, connection: sqlite3.Connection, batch: list[Waiting]) -> None:
        try:
            self._write(connection, [row for row, _done in batch])
        except sqlite3.Error as exc:
            if len(batch) == 1 or "locked" in str(exc):
                _settle(batch, self._translate(exc))
                return
            for one in batch:  # find the row the database refuses; write the others
                self._commit(connection, [one])
            return
        _settle(batch, None)

    def _write(self, connection: sqlite3.Connection, rows: Sequence[Row]) -> None:
        """One transaction: BEGIN IMMEDIATE (the lock polled for), the rows, COMMIT."""
        deadline = time.monotonic() + self._lock_wait_seconds
        while True:
            try:
                connection.execute("BEGIN IMMEDIATE").close()
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(LOCK_POLL_SECONDS)
        try:
            connection.executemany(self._sql, rows).close()
            connection.execute("COMMIT").close()
        except BaseException:
            connection.rollback()
            raise


def _settle(batch: Sequence[Waiting], error: BaseException | None) -> None:
    """Tell each waiting future, on its own loop, that its row is in or failed."""
    for _row, done in batch:
        with contextlib.suppress(RuntimeError):  # its loop closed: nobody is waiting
            done.get_loop().call_soon_threadsafe(_resolve, done, error)


def _resolve(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():  # the caller stopped waiting (cancelled)
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
