"""What differs between the PostgreSQL drivers: asyncpg and psycopg 3.

The hot paths (the outbox INSERT, the claim, LISTEN) use the driver connection itself
(decisions 0011, 0035), so they ask which driver it is; a connect timeout is spelt per
driver; and an error a driver raised directly is turned into what SQLAlchemy would have
raised.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy.engine import URL, Dialect
from sqlalchemy.exc import DBAPIError


def is_asyncpg(dialect: Dialect) -> bool:
    """Whether ``dialect`` talks to PostgreSQL through asyncpg, whose connection the hot
    paths (the outbox INSERT, the claim, LISTEN) use directly."""
    return dialect.driver == "asyncpg"


def is_psycopg(dialect: Dialect) -> bool:
    """Whether ``dialect`` is psycopg 3 (async or sync), which has paths of its own."""
    return dialect.driver in ("psycopg", "psycopg_async")


def connect_timeout_args(url: URL, seconds: float) -> dict[str, Any]:
    """``connect_args`` that bound a PostgreSQL connect to ``seconds``, as the URL's
    driver spells it: asyncpg's ``timeout``, libpq's (psycopg's) whole-second
    ``connect_timeout``."""
    if url.drivername == "postgresql+psycopg":
        return {"connect_timeout": max(1, math.ceil(seconds))}
    return {"timeout": seconds}


def as_dbapi_error(dialect: Dialect, sql: str, exc: Exception) -> Exception:
    """``exc`` from asyncpg or psycopg, called directly, as SQLAlchemy would raise it.

    For the statements the hot paths send straight to the driver (the outbox INSERT,
    the claim): IntegrityError, ProgrammingError, OperationalError ... as from
    ``execute``, so callers (and the run loop's storage-error handling) see one kind.
    Anything the driver's error map does not know (an OSError) is returned as is.
    """
    dbapi = dialect.loaded_dbapi
    if is_psycopg(dialect) and isinstance(exc, dbapi.Error):
        # psycopg's own errors are the DB-API's: SQLAlchemy wraps them as they are.
        wrapped: Exception = DBAPIError.instance(sql, None, exc, dbapi.Error, dialect=dialect)
        return wrapped
    translate = getattr(dbapi, "_asyncpg_error_translate", {})
    for kind in type(exc).__mro__:
        if kind in translate:
            orig = translate[kind](exc.args[0] if exc.args else str(exc), exc)
            error: Exception = DBAPIError.instance(sql, None, orig, dbapi.Error, dialect=dialect)
            return error
    return exc
