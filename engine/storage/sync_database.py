"""Sync engines for producers that publish from synchronous code (sync_unit_of_work).

Dispatchers, the console and the CLI are async (engine.storage.database); a Flask app, a
sync route or a script writes its events through a sync ``Engine``. On SQLite it is tuned
as the async one is: WAL, a 30 s busy timeout, and write transactions that begin
IMMEDIATE, so a producer never fails halfway to upgrading its read lock while a
dispatcher writes.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError

from engine.errors import DatabaseUrlError
from engine.storage.database import _in_memory, configure_sqlite_connection
from engine.storage.secrets import mask_url

SYNC_DRIVERS = ("sqlite+pysqlite", "postgresql+psycopg", "postgresql+psycopg2")
_ALIASES = {"sqlite": "sqlite+pysqlite", "postgresql": "postgresql+psycopg2"}
_EXTRAS = {
    "postgresql+psycopg": "psycopg[binary] (pip install 'outbox-tui[psycopg]')",
    "postgresql+psycopg2": "psycopg2 (pip install psycopg2-binary)",
}


def parse_sync_database_url(url: str | URL) -> URL:
    """``url`` as a sync driver URL: ``sqlite:///path.db``, ``postgresql+psycopg://``
    or ``postgresql+psycopg2://`` (``postgresql://`` is psycopg2, as in SQLAlchemy)."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except ArgumentError:
        raise DatabaseUrlError(f"invalid database URL {mask_url(str(url))!r}") from None
    name = _ALIASES.get(parsed.drivername, parsed.drivername)
    if name not in SYNC_DRIVERS:
        raise DatabaseUrlError(
            f"unsupported sync database URL scheme {parsed.drivername!r} in "
            f"{mask_url(parsed)!r}: use sqlite:///path.db, postgresql+psycopg://... or "
            "postgresql+psycopg2://..."
        )
    parsed = parsed.set(drivername=name)
    if name.startswith("sqlite") and _in_memory(parsed):
        raise DatabaseUrlError(
            "an in-memory SQLite database is seen by no dispatcher: give a file path, "
            "e.g. sqlite:///./outbox.db"
        )
    return parsed


def create_sync_engine(url: str | URL, **kwargs: Any) -> Engine:
    """A sync ``Engine`` for publishing from synchronous code, tuned for the outbox."""
    parsed = parse_sync_database_url(url)
    try:
        engine = sa_create_engine(parsed, **kwargs)
    except ImportError as exc:
        need = _EXTRAS.get(parsed.drivername, exc.name or "its driver")
        raise DatabaseUrlError(
            f"{parsed.drivername} needs {need}, which is not installed ({exc})"
        ) from None
    if parsed.drivername.startswith("sqlite"):
        _tune_sqlite(engine)
    return engine


def _tune_sqlite(engine: Engine) -> None:
    event.listen(engine, "connect", configure_sqlite_connection)

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
