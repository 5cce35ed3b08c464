"""The hot queries are served by indexes, not table scans, on both databases."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import bindparam, func, select, text
from sqlalchemy.dialects import postgresql, sqlite

from engine import dispatch_health, insights, pauses, store
from engine.schema import UtcDateTime
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
    abandoned = select(t.c.id).where(store._abandoned(clock())).order_by(t.c.locked_until).limit(1)
    plan = await _plan(db, abandoned)
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_" in plan


async def test_counting_a_status_uses_an_index(db):
    stmt = select(func.count()).select_from(t).where(t.c.status == "dead_letter")
    plan = await _plan(db, stmt)
    # The backlog index (status, event_type, tenant_id) is as good for it as the status index.
    assert any(f"ix_outbox_events_{i}" in plan for i in ("status_id", "type_backlog")), plan
    _assert_no_table_scan(plan)


async def test_retention_window_is_found_through_an_index(db, clock):
    stmt = (
        select(func.count())
        .select_from(t)
        .where(t.c.status == "published", t.c.published_at < clock())
    )
    _assert_no_table_scan(await _plan(db, stmt))


async def _text_plan(db, sql: str, params: dict) -> str:
    typed = [
        bindparam(k, type_=UtcDateTime()) for k, v in params.items() if isinstance(v, datetime)
    ]
    async with db.connect() as conn:
        if db.dialect.name == "postgresql":
            await conn.exec_driver_sql("SET enable_seqscan = off")
            rows = await conn.execute(text("EXPLAIN " + sql).bindparams(*typed), params)
        else:
            rows = await conn.execute(text("EXPLAIN QUERY PLAN " + sql).bindparams(*typed), params)
        return "\n".join(str(r[-1]) for r in rows)


@pytest.mark.parametrize("ordered_first", [True, False])
async def test_the_claim_walks_keys_and_unordered_rows_through_their_indexes(
    db, clock, ordered_first
):
    if db.dialect.name == "postgresql":  # plans on an empty table are coin tosses: give it stats
        async with db.begin() as conn:
            await conn.exec_driver_sql(
                "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, "
                "aggregate_type, aggregate_id, payload, ordering_key) "
                "SELECT 'e' || i, 't', 'x', 1, 'o', 'a', '{}', "
                "CASE WHEN i % 3 = 0 THEN NULL ELSE 'k' || (i % 500) END "
                "FROM generate_series(1, 20000) AS i"
            )
            await conn.exec_driver_sql("ANALYZE outbox_events")
    sql = store._claim_sql(db.dialect.name, ordered_first)
    params = {
        "now": clock(),
        "locked_until": clock(),
        "dispatcher_id": "d",
        "batch": 100,
        "key_cursor": "",
        "walk_limit": 400,
    }
    plan = await _text_plan(db, sql, params)
    _assert_no_table_scan(plan)
    for index in ("key_order", "key_in_flight", "unordered", "leased"):
        assert f"ix_outbox_events_{index}" in plan, plan


async def test_blocked_heads_are_found_through_the_stalled_index(db):
    plan = await _text_plan(db, dispatch_health.blocked_heads_sql(db.dialect.name), {})
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_key_stalled" in plan
    assert "ix_outbox_events_key_order" in plan


async def test_a_scoped_claim_reads_one_range_per_served_type(db, clock):
    """While rows of other types wait, the unordered claim never walks them."""
    if db.dialect.name == "postgresql":
        async with db.begin() as conn:
            await conn.exec_driver_sql(
                "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, "
                "aggregate_type, aggregate_id, payload) "
                "SELECT 'e' || i, 't', CASE WHEN i % 10 = 0 THEN 'a' ELSE 'unserved' END, 1, "
                "'o', 'a', '{}' FROM generate_series(1, 20000) AS i"
            )
            await conn.exec_driver_sql("ANALYZE outbox_events")
    sql = store._claim_sql(db.dialect.name, True, scoped=True, per_type=2)
    params = {
        **store._scope_params(db.dialect.name, store.ClaimScope(frozenset({"a", "b"}))),
        "type_0": "a",
        "type_1": "b",
        "now": clock(),
        "locked_until": clock(),
        "dispatcher_id": "d",
        "batch": 100,
        "key_cursor": "",
        "walk_limit": 400,
    }
    plan = await _text_plan(db, sql, params)
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_unordered_type" in plan, plan
    assert "ix_outbox_events_unordered " not in plan + " ", plan


async def test_oldest_pending_is_found_through_indexes(db):
    created, replayed = insights.oldest_due_statements(db.dialect.name)
    plan = await _plan(db, created)
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_status_id" in plan or "ix_outbox_events_type_backlog" in plan, plan
    plan = await _text_plan(db, replayed.element.text, {})
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_replayed_pending" in plan, plan


async def test_top_types_and_pause_counts_stay_inside_the_backlog_and_in_flight_indexes(db):
    backlog, in_flight = insights.top_types_statements()
    plan = await _plan(db, backlog)
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_type_backlog" in plan, plan
    plan = await _plan(db, in_flight)
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_leased" in plan, plan
    for tenant in (None, "acme"):
        plan = await _plan(db, pauses.waiting_count("orders.placed", tenant))
        _assert_no_table_scan(plan)
        assert "ix_outbox_events_type_backlog" in plan, plan
