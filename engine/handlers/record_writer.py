"""Side-effect records, group-committed: one writer per store, many records a transaction.

A side effect's record is what stops a retry from calling the external system again, so
the time from the call's return to its record's commit is a window in which a crash
repeats the call. Written one transaction each, concurrent handlers' records queued for
SQLite's write lock and for pool connections, and a crash cut off the whole queue. Here
each call queues its record at once and awaits that record's commit; one writer commits
everything that arrived while its previous commit ran, as one transaction: on SQLite a
thread of its own (engine.storage.sqlite_batches), so no commit waits for the event
loop's next turn; on PostgreSQL a task on a connection it keeps while records keep
coming, sending a batch as one pipelined, atomic ``executemany`` on asyncpg (one
transaction through SQLAlchemy on psycopg). See decision 0037.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import Insert

from engine.storage.database import SQLITE_BUSY_TIMEOUT_SECONDS
from engine.storage.drivers import as_dbapi_error, is_asyncpg
from engine.storage.sqlite_batches import SqliteBatchWriter

# How long a record waits for SQLite's write lock before its call fails: as long as any
# other writer would.
LOCK_WAIT_SECONDS = SQLITE_BUSY_TIMEOUT_SECONDS
# How long the PostgreSQL writer keeps its connection without a record: past the gaps
# between a dispatcher's rounds, so a round's first record finds it still held.
KEEP_CONNECTION_SECONDS = 0.25
Record = dict[str, Any]  # the column values of one row
Waiting = tuple[Record, asyncio.Future[None]]


@dataclass(frozen=True, slots=True)
class DriverStatement:
    """A statement compiled for the driver: its text and each record's parameters.

    The parameters go through the columns' own bind processing (JSON, UTC timestamps),
    so the rows are what SQLAlchemy would send; only its execution is bypassed.
    """

    sql: str
    names: tuple[str, ...]
    processors: Mapping[str, Callable[[Any], Any] | None]
    compiled: Any  # the SQLCompiler, for the parameters the statement fixes itself

    @classmethod
    def compile(cls, stmt: Insert, dialect: Dialect, columns: Sequence[str]) -> DriverStatement:
        compiled = stmt.compile(dialect=dialect, column_keys=list(columns), for_executemany=True)
        names = tuple(compiled.positiontup or ())
        processors = {
            name: compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect)
            for name in names
        }
        return cls(compiled.string, names, processors, compiled)

    def parameters(self, record: Record) -> tuple[Any, ...]:
        """The driver's parameters for ``record``; raises what the bind processing raises
        (a value that is not JSON-serialisable)."""
        params = self.compiled.construct_params(record)
        row = []
        for name in self.names:
            process = self.processors[name]
            row.append(params[name] if process is None else process(params[name]))
        return tuple(row)


class RecordWriter:
    """Commits records through one upsert, in batches; each caller learns when its record is in.

    ``statement(dialect)`` builds the upsert of one record with the ``columns`` keys. A
    record whose values cannot be bound fails alone, at once; a batch the database
    refuses is written again one record at a time, so a refused record fails only its
    own caller. On PostgreSQL the writer task holds one connection while records keep
    arriving (no pool queue between a call and its record) and ends, handing it back,
    after ``KEEP_CONNECTION_SECONDS`` without one; SQLite's thread ends likewise: nothing needs
    closing.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        statement: Callable[[Dialect], Insert],
        columns: Sequence[str],
    ) -> None:
        self._engine = engine
        dialect = engine.dialect
        self._statement = statement(dialect)
        # The driver's own path where the engine has one (SQLite's thread, asyncpg).
        self._compiled = (
            DriverStatement.compile(self._statement, dialect, columns)
            if dialect.name == "sqlite" or is_asyncpg(dialect)
            else None
        )
        self._waiting: list[Waiting] = []
        self._task: asyncio.Task[None] | None = None
        self._arrived = asyncio.Event()
        self._thread: SqliteBatchWriter | None = None
        if self._compiled is not None and dialect.name == "sqlite":
            args, kwargs = dialect.create_connect_args(engine.url)
            kwargs = {**kwargs, "isolation_level": None, "check_same_thread": True}
            self._thread = SqliteBatchWriter(
                functools.partial(sqlite3.connect, *args, **kwargs),
                self._compiled.sql,
                lock_wait_seconds=LOCK_WAIT_SECONDS,
                translate=functools.partial(_as_dbapi_error, dialect, self._compiled.sql),
            )

    def submit(self, record: Record) -> asyncio.Future[None]:
        """Queue ``record`` for the next commit, at once (no await between a call's return
        and its record joining the queue); the future is done once it is committed."""
        done = asyncio.get_running_loop().create_future()
        if self._thread is not None and self._compiled is not None:
            try:
                row = self._compiled.parameters(record)
            except Exception as exc:
                done.set_exception(exc)
                return done
            self._thread.submit(row, done)
            return done
        self._waiting.append((record, done))
        if self._task is None:
            self._task = asyncio.create_task(self._write_while_waiting())
        else:
            self._arrived.set()
        return done

    async def _write_while_waiting(self) -> None:
        batch: list[Waiting] = []
        try:
            while self._waiting:
                async with self._engine.connect() as conn:
                    raw = await conn.get_raw_connection()
                    driver = raw.driver_connection
                    while self._waiting or await self._more_within(KEEP_CONNECTION_SECONDS):
                        batch, self._waiting = self._waiting, []
                        await self._commit(conn, driver, batch)
                        if _lost(driver):  # the server went away: the pool must not reuse it
                            await conn.invalidate()
                            break
        except Exception as exc:  # no connection: the records waiting fail with it
            _settle([*batch, *self._waiting], exc)
        finally:
            self._task = None
            # Cancelled (the event loop is closing): the callers wait no longer either.
            for _record, done in [*batch, *self._waiting]:
                if not done.done():
                    done.cancel()
            self._waiting = []

    async def _more_within(self, seconds: float) -> bool:
        """Whether a record arrives within ``seconds``: the connection is kept that long,
        so a record after a pause does not queue for one from the pool."""
        self._arrived.clear()
        try:
            await asyncio.wait_for(self._arrived.wait(), seconds)
        except TimeoutError:
            return bool(self._waiting)
        return True

    async def _commit(self, conn: AsyncConnection, driver: Any, batch: list[Waiting]) -> None:
        compiled = self._compiled
        rows: list[tuple[Any, ...]] = []
        sent: list[Waiting] = []
        for record, done in batch:
            if compiled is not None:
                try:
                    rows.append(compiled.parameters(record))
                except Exception as exc:
                    _settle([(record, done)], exc)
                    continue
            sent.append((record, done))
        if not sent:
            return
        try:
            if compiled is not None:
                await _write(driver, conn.dialect, compiled.sql, rows)
            else:  # a driver without a path of its own (psycopg): SQLAlchemy's execute
                await _execute(conn, self._statement, [record for record, _done in sent])
        except Exception as exc:
            if len(sent) == 1 or _lost(driver):
                _settle(sent, exc)
                return
            for one in sent:  # find the record the database refuses; write the others
                await self._commit(conn, driver, [one])
            return
        _settle(sent, None)


async def _write(driver: Any, dialect: Dialect, sql: str, rows: list[tuple[Any, ...]]) -> None:
    """One transaction, one round trip: asyncpg's ``executemany`` is pipelined and atomic."""
    try:
        await driver.executemany(sql, rows)
    except Exception as exc:
        raise as_dbapi_error(dialect, sql, exc) from exc


async def _execute(conn: AsyncConnection, stmt: Insert, records: list[Record]) -> None:
    """One transaction through SQLAlchemy, for a driver without a path of its own."""
    async with conn.begin():
        await conn.execute(stmt, records)


def _as_dbapi_error(dialect: Dialect, sql: str, exc: Exception) -> BaseException:
    """A sqlite3 error as SQLAlchemy raises it from ``execute``."""
    if isinstance(exc, sqlite3.Error):
        return DBAPIError.instance(sql, None, exc, sqlite3.Error, dialect=dialect)
    return exc


def _lost(driver: Any) -> bool:
    """Whether the driver's connection has closed: asyncpg's ``is_closed()``, psycopg's
    ``closed``."""
    is_closed = getattr(driver, "is_closed", None)
    if callable(is_closed):
        return bool(is_closed())
    return getattr(driver, "closed", False) is True


def _settle(batch: Sequence[Waiting], error: BaseException | None) -> None:
    for _record, done in batch:
        if done.done():  # the caller stopped waiting (cancelled)
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)
