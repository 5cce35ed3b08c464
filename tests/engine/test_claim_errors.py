"""A claim's database errors reach callers as SQLAlchemy's, whichever path ran the claim.

On PostgreSQL the claim statement runs on the asyncpg connection itself
(engine.dispatch.claimer), so the run loop's storage-error handling
(engine.running.run_loop.STORAGE_ERRORS) depends on its errors being translated as
``execute`` would raise them.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, ProgrammingError

from engine import create_engine, create_schema
from engine.dispatch.claimer import ClaimedBatch, Claimer
from engine.running.run_loop import STORAGE_ERRORS

# On SQLite, and on PostgreSQL through asyncpg and through psycopg 3.
pytestmark = pytest.mark.all_drivers


async def claim(db, clock) -> ClaimedBatch:
    async with db.begin() as conn:
        return await Claimer("d", 10, timedelta(seconds=30)).claim(conn, clock.now)


async def test_a_missing_table_is_a_dbapi_error_the_run_loop_handles(db, clock):
    async with db.begin() as conn:
        await conn.execute(text("DROP TABLE outbox_events"))
    with pytest.raises(DBAPIError) as caught:
        await claim(db, clock)
    assert isinstance(caught.value, STORAGE_ERRORS)
    if db.dialect.name == "postgresql":
        assert isinstance(caught.value, ProgrammingError)
        assert "outbox_events" in str(caught.value.orig)


@pytest.mark.postgresql
async def test_a_cancelled_claim_raises_what_execute_raises(pg_url, clock):
    """statement_timeout cancels statements that wait for a lock: the claim's error is the
    one SQLAlchemy's ``execute`` raises for the same cancellation, a storage error."""
    db = create_engine(pg_url)
    try:
        await create_schema(db)
        raised = []
        async with db.begin() as holder:
            await holder.execute(text("LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE"))
            for use_claim in (False, True):
                async with db.connect() as waiting:
                    await waiting.execute(text("SET LOCAL statement_timeout = 100"))
                    with pytest.raises(DBAPIError) as caught:
                        if use_claim:
                            await Claimer("d", 10, timedelta(seconds=30)).claim(waiting, clock.now)
                        else:
                            await waiting.execute(text("SELECT 1 FROM outbox_events"))
                    assert "statement timeout" in str(caught.value.orig)
                    raised.append(type(caught.value))
        assert raised[0] is raised[1]
        assert issubclass(raised[1], STORAGE_ERRORS)
    finally:
        await db.dispose()
