"""The hot queries are served by indexes, not table scans, on both databases."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite

from engine import store
from engine.schema import outbox_events as t


def _sql(db, stmt) -> str:
    dialect = postgresql.dialect() if db.dialect.name == "postgresql" else sqlite.dialect()
    return str(stmt.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


async def _plan(db, stmt) -> str:
    async with db.connect() as conn:
        if db.dialect.name == "postgresql":
            await conn.exec_driver_sql("SET enable_seqscan = off")  # tiny tables: ask if usable
            rows = await conn.exec_driver_sql("EXPLAIN " + _sql(db, stmt))
        else:
            rows = await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + _sql(db, stmt))
        return "\n".join(str(r[-1]) for r in rows)


def _assert_no_table_scan(plan: str) -> None:
    assert "Seq Scan" not in plan, plan
    for line in plan.splitlines():  # SQLite: "SCAN outbox_events" alone is a full scan
        assert not (line.startswith("SCAN outbox_events") and "INDEX" not in line), plan


async def test_claim_candidates_are_found_through_an_index(db, clock):
    waiting = select(t.c.id).where(store._waiting(clock())).order_by(t.c.id).limit(100)
    plan = await _plan(db, waiting)
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_" in plan
    abandoned = (
        select(t.c.id).where(store._abandoned(clock())).order_by(t.c.locked_until).limit(1)
    )
    plan = await _plan(db, abandoned)
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_" in plan


async def test_counting_a_status_uses_an_index(db):
    stmt = select(func.count()).select_from(t).where(t.c.status == "dead_letter")
    plan = await _plan(db, stmt)
    assert "ix_outbox_events_status_id" in plan or "ix_outbox_events_active" in plan
    _assert_no_table_scan(plan)


async def test_retention_window_is_found_through_an_index(db, clock):
    stmt = (
        select(func.count())
        .select_from(t)
        .where(t.c.status == "published", t.c.published_at < clock())
    )
    _assert_no_table_scan(await _plan(db, stmt))
