"""psycopg 3's side of the statements the engine sends straight to the driver.

On asyncpg the outbox INSERT and the claim skip SQLAlchemy's statement execution and run
on the driver connection (engine.writing.publisher, engine.dispatch.claimer). On psycopg
they do the same with psycopg's own calls, in the transaction SQLAlchemy runs on that
connection: a psycopg connection that is not in autocommit mode opens one at its first
statement and SQLAlchemy commits or rolls it back. The claim's rows keep their payload as
the JSON text stored (psycopg would decode ``jsonb`` itself): the dispatcher decodes it
strictly and the relay sends it as is. See decision 0035.

psycopg is imported only here and only when a psycopg connection is used: it is an
optional dependency (``pip install 'outbox-tui[psycopg]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ClauseElement

from engine.storage.drivers import as_dbapi_error

_COMPILED: dict[ClauseElement, tuple[str, tuple[str, ...]]] = {}


def compiled_sql(stmt: ClauseElement, dialect: Dialect) -> tuple[str, tuple[str, ...]]:
    """``stmt`` as psycopg runs it (``%(name)s`` parameters) and its parameters' names.

    Compiled once per statement: the claim statements are cached themselves.
    """
    found = _COMPILED.get(stmt)
    if found is None:
        compiled = stmt.compile(dialect=dialect)
        found = _COMPILED[stmt] = (compiled.string, tuple(compiled.params))
    return found


def _text_json_cursor(driver: Any) -> Any:
    """A cursor of ``driver`` whose rows are dicts and whose json/jsonb columns stay text."""
    from psycopg.rows import dict_row
    from psycopg.types.string import TextLoader

    cursor = driver.cursor(row_factory=dict_row)
    for name in ("json", "jsonb"):
        cursor.adapters.register_loader(name, TextLoader)
    return cursor


async def fetch_rows(
    conn: AsyncConnection, stmt: ClauseElement, values: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Run ``stmt`` on the connection's psycopg connection, in its transaction.

    The rows are psycopg's dicts (no SQLAlchemy result processing, as asyncpg's records
    are on that driver); JSON columns come back as their text. Errors are raised as
    ``conn.execute`` would raise them.
    """
    sql, names = compiled_sql(stmt, conn.dialect)
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    assert driver is not None and not driver.autocommit, "the claim runs in a transaction"
    params = {name: values[name] for name in names}
    try:
        async with _text_json_cursor(driver) as cursor:
            await cursor.execute(sql, params)
            rows: list[dict[str, Any]] = await cursor.fetchall()
    except Exception as exc:
        raise as_dbapi_error(conn.dialect, sql, exc) from exc
    return rows


def _as_is(text: str) -> str:
    return text


def jsonb_text() -> Callable[[str], Any]:
    """A function wrapping a payload's JSON text as psycopg binds ``jsonb`` (a text
    parameter would need a cast: text has no assignment cast to jsonb). The text is
    serialised beforehand, so a payload that is not JSON fails before any round trip."""
    from psycopg.types.json import Jsonb

    def wrap(text: str) -> Any:
        return Jsonb(text, dumps=_as_is)

    return wrap


async def insert_rows(
    driver: Any, dialect: Dialect, batches: Sequence[tuple[str, list[tuple[Any, ...]]]]
) -> None:
    """Run each (INSERT, rows) of ``batches`` on the psycopg connection ``driver``, in its
    transaction: one prepared ``execute`` for one row, ``executemany`` (psycopg pipelines
    it: one round trip) for several."""
    async with driver.cursor() as cursor:
        for sql, values in batches:
            try:
                if len(values) == 1:
                    await cursor.execute(sql, values[0], prepare=True)
                else:
                    await cursor.executemany(sql, values)
            except Exception as exc:
                raise as_dbapi_error(dialect, sql, exc) from exc


class NotificationPump:
    """LISTEN on a psycopg connection, calling ``callback`` per notification.

    asyncpg calls its listeners from its protocol; a psycopg connection delivers
    notifications to whoever waits in ``notifies()``, so a task waits there. It offers
    the two calls the wake-up listener makes on asyncpg's connection: ``is_closed`` and
    ``remove_listener``. The connection must be in autocommit mode (a LISTEN inside a
    transaction starts only at its commit).
    """

    def __init__(self, driver: Any, channel: str, callback: Callable[..., None]) -> None:
        self._driver = driver
        self._channel = channel
        self._callback = callback
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        from psycopg import sql

        await self._driver.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        self._task = asyncio.get_running_loop().create_task(
            self._pump(), name="outbox-wakeup-notifies"
        )

    async def _pump(self) -> None:
        async for notification in self._driver.notifies():
            self._callback(notification)

    def is_closed(self) -> bool:
        return bool(self._driver.closed) or self._task is None or self._task.done()

    async def remove_listener(self, _channel: str, _callback: Callable[..., None]) -> None:
        """Stop waiting for notifications (the caller discards the connection)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
