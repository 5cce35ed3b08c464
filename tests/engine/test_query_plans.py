"""The hot queries are served by indexes, not table scans, on both databases."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from sqlalchemy import ARRAY, Text, bindparam, func, select, text
from sqlalchemy.dialects import postgresql, sqlite

from engine import create_engine, create_schema
from engine.dispatch import claim_sql, claimer, fenced_writes
from engine.dispatch.claimer import Claimer, ClaimScope
from engine.operating import dispatch_health, insights, pauses
from engine.operating.event_views import SUMMARY_COLUMNS, EventFilter, filtered
from engine.storage.schema import IN_FLIGHT_PREDICATE, KEYED_PREDICATE, UtcDateTime
from engine.storage.schema import outbox_events as t


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


def key_index(db) -> str:
    """The index a dialect's ordered claim and per-key queries read (schema.ONLY_ON)."""
    return {"postgresql": "ix_outbox_events_key_turn", "sqlite": "ix_outbox_events_key_order"}[
        db.dialect.name
    ]


async def _plan_without(db, index: str, sql: str) -> str:
    """The plan of ``sql`` once ``index`` is gone (dropped in a transaction rolled back)."""
    async with db.connect() as conn, conn.begin() as tx:
        await conn.exec_driver_sql(f"DROP INDEX {index}")
        if db.dialect.name == "postgresql":
            await conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            rows = await conn.exec_driver_sql("EXPLAIN " + sql)
        else:
            rows = await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)
        plan = "\n".join(str(r[-1]) for r in rows)
        await tx.rollback()
    return plan


async def test_the_in_flight_probe_and_the_lease_queries_cannot_use_each_others_index(db, clock):
    """Each can be served by its own index only, never by reading the other one whole.

    When both said "in flight" the same way (locked_by IS NOT NULL), PostgreSQL's planner
    came to answer the claim's per-key probe by reading every leased row mid-drain: 500
    heads x 500 leased rows, most of an ordered claim's time. So with its own index gone,
    the probe falls back to a table scan, not to the lease index, and the other way round.
    PostgreSQL's claim has no probe since (its key index holds what is in flight): there
    the lease queries must not read the key index instead.
    """
    in_flight_index = "ix_outbox_events_key_in_flight"
    if db.dialect.name == "sqlite":
        probe = (
            "SELECT 1 FROM outbox_events AS f WHERE f.ordering_key = 'k' "
            f"AND {KEYED_PREDICATE} AND {IN_FLIGHT_PREDICATE} LIMIT 1"
        )
        plan = await _plan_without(db, in_flight_index, probe)
        assert "ix_outbox_events_lease" not in plan, plan
    else:
        in_flight_index = key_index(db)
    _backlog, in_flight_by_type = insights.top_types_statements()
    for stmt in (insights.stuck_statement(clock()), in_flight_by_type):
        plan = await _plan_without(db, "ix_outbox_events_lease_expiry", _sql(db, stmt))
        assert in_flight_index not in plan, plan


async def test_counting_a_status_uses_an_index(db):
    stmt = select(func.count()).select_from(t).where(t.c.status == "dead_letter")
    plan = await _plan(db, stmt)
    # The backlog index (status, event_type, tenant_id) is as good for it as the status index.
    assert any(f"ix_outbox_events_{i}" in plan for i in ("backlog_id", "type_backlog")), plan
    _assert_no_table_scan(plan)


async def test_retention_window_is_found_through_an_index(db, clock):
    stmt = (
        select(func.count())
        .select_from(t)
        .where(t.c.status == "published", t.c.published_at < clock())
    )
    _assert_no_table_scan(await _plan(db, stmt))


async def test_the_purges_of_local_and_inbound_rows_read_their_published_at_indexes(db, clock):
    """The local purge, with or without the inbound rows' longer window, reads
    ix_outbox_events_published_at; the inbound purge reads the index that holds only the
    published inbound rows, not the other one past every local row."""
    from engine.operating import retention

    async with db.begin() as conn:  # 2,000 local published rows, 20 inbound ones
        for n in range(2020):
            inbound = f"'/shop', 'in-{n}'" if n >= 2000 else "NULL, NULL"
            await conn.exec_driver_sql(
                "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, "
                "aggregate_type, aggregate_id, payload, status, published_at, inbound_source, "
                f"inbound_id) VALUES ('p-{n}', 'acme', 'x', 1, 'a', 'b', '{{}}', 'published', "
                f"CURRENT_TIMESTAMP, {inbound})"
            )
        await conn.exec_driver_sql("ANALYZE")
    now = clock()
    local = retention.purge_candidates(now, 500, inbound_older_than=now - timedelta(days=7))
    for stmt in (retention.purge_candidates(now, 500), local):
        plan = await _plan(db, stmt)
        _assert_no_table_scan(plan)
        assert "ix_outbox_events_published_at" in plan, plan
    plan = await _plan(db, retention.inbound_purge_candidates(now, 500))
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_inbound_published" in plan, plan


async def test_the_inbound_rows_are_counted_inside_their_unique_index(db):
    from engine.operating.overview import inbound_rows_statement

    plan = await _plan(db, inbound_rows_statement())
    _assert_no_table_scan(plan)
    assert "uq_outbox_events_inbound" in plan, plan


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
    sql = claim_sql.claim_sql(db.dialect.name, claim_sql.ClaimShape(ordered_first))
    params = {
        "now": clock(),
        "locked_until": clock(),
        "dispatcher_id": "d",
        "batch": 100,
        "key_cursor": "",
        "seq_floor": 0,
        "walk_limit": 400,
    }
    plan = await _text_plan(db, sql, params)
    _assert_no_table_scan(plan)
    indexes = ["waiting", "lease_expiry"]
    indexes += ["key_turn"] if db.dialect.name == "postgresql" else ["key_order", "key_in_flight"]
    for index in indexes:
        assert f"ix_outbox_events_{index}" in plan, plan


async def test_blocked_heads_are_found_through_the_stalled_index(db):
    plan = await _text_plan(db, dispatch_health.blocked_heads_sql(db.dialect.name), {})
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_key_stalled" in plan
    assert key_index(db) in plan


async def test_what_dead_letters_hold_is_counted_through_the_key_index(db):
    plan = await _text_plan(db, dispatch_health.blocked_summary_sql(db.dialect.name), {})
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_key_stalled" in plan
    assert key_index(db) in plan


async def test_a_range_of_one_keys_rows_is_bounded_in_the_key_index(db):
    """ "How many events of its key come before it" and "how many wait behind the head"
    read only that range of the key's rows, never all of them. PostgreSQL's key index
    keeps rows in flight apart from rows at rest: two ranges, each bounded by seq."""
    for where, bound in ((t.c.seq < 10, "seq <"), (t.c.seq > 10, "seq >")):
        for stmt in dispatch_health.key_count_statements(db.dialect.name, "k", where):
            plan = await _plan(db, stmt)
            assert key_index(db) in plan, plan
            if db.dialect.name == "postgresql":
                conditions = [line for line in plan.splitlines() if "Index Cond" in line]
                # The part is a bound of the scan, not a filter over the whole key: a
                # non-leading seq can show in the condition either way.
                assert conditions and bound in conditions[0], plan
                assert "locked_by IS NULL" in conditions[0], plan
                assert "Filter" not in plan, plan
            else:
                assert bound.replace(" ", "") in plan, plan


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
    sql = claim_sql.claim_sql(db.dialect.name, claim_sql.ClaimShape(scoped=True, per_type=2))
    params = {
        **claim_sql.scope_params(db.dialect.name, ClaimScope(frozenset({"a", "b"}))),
        "type_0": "a",
        "type_1": "b",
        "now": clock(),
        "locked_until": clock(),
        "dispatcher_id": "d",
        "batch": 100,
        "key_cursor": "",
        "seq_floor": 0,
        "walk_limit": 400,
    }
    plan = await _text_plan(db, sql, params)
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_waiting_type" in plan, plan
    assert "ix_outbox_events_waiting " not in plan + " ", plan


async def test_oldest_pending_is_found_through_indexes(db):
    created, replayed = insights.oldest_due_statements(db.dialect.name)
    plan = await _plan(db, created)
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_backlog_id" in plan or "ix_outbox_events_type_backlog" in plan, plan
    plan = await _text_plan(db, replayed.element.text, {})
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_replayed_pending" in plan, plan


async def test_top_types_and_pause_counts_stay_inside_the_backlog_and_in_flight_indexes(db):
    backlog, in_flight = insights.top_types_statements()
    plan = await _plan(db, backlog)
    _assert_no_table_scan(plan)
    # It counts every backlog row: either index over the backlog alone serves it, and on a
    # near-empty table their costs tie (which one wins followed the tests run before).
    assert "ix_outbox_events_type_backlog" in plan or "ix_outbox_events_backlog_id" in plan, plan
    plan = await _plan(db, in_flight)
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_lease_expiry" in plan, plan
    for tenant in (None, "acme"):
        plan = await _plan(db, pauses.waiting_count("orders.placed", tenant))
        _assert_no_table_scan(plan)
        assert "ix_outbox_events_type_backlog" in plan, plan


async def _fill_unserved_backlog(db, keys: int, behind: int, first: int = 0) -> None:
    """``keys`` ordering keys, each headed by an event of a type nobody here serves, with
    ``behind`` events of a served type queued after it (``first``: the id numbering's start,
    to queue more behind the same heads later), plus unordered rows of that unserved type."""
    pg = db.dialect.name == "postgresql"
    numbers = (
        f"generate_series({first}, {first + keys * behind - 1}) AS s(i)"
        if pg
        else f"(WITH RECURSIVE s(i) AS (SELECT {first} UNION ALL SELECT i + 1 FROM s "
        f"WHERE i < {first + keys * behind - 1}) SELECT i FROM s)"
    )
    heads = (
        f"generate_series(0, {keys - 1}) AS s(i)"
        if pg
        else f"(WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s "
        f"WHERE i < {keys - 1}) SELECT i FROM s)"
    )
    insert = (
        "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, "
        "aggregate_type, aggregate_id, payload, ordering_key) "
    )
    async with db.begin() as conn:
        if first == 0:
            await conn.exec_driver_sql(
                insert + f"SELECT 'h' || i, 't', 'unserved', 1, 'o', 'a', '{{}}', 'k' || i "
                f"FROM {heads}"
            )
            await conn.exec_driver_sql(
                insert + f"SELECT 'u' || i, 't', 'unserved', 1, 'o', 'a', '{{}}', NULL FROM {heads}"
            )
        await conn.exec_driver_sql(
            insert + f"SELECT 'b' || i, 't', 'a', 1, 'o', 'a', '{{}}', 'k' || (i % {keys}) "
            f"FROM {numbers}"
        )
        await conn.exec_driver_sql("ANALYZE outbox_events" if pg else "ANALYZE")


async def _claim_work(db, clock, scope: ClaimScope) -> tuple[int, int]:
    """(rows claimed, work done) for one scoped claim (Claimer.claim), rolled back afterwards.

    Work: on SQLite the virtual machine instructions the claim ran (a progress handler
    counting every 100); on PostgreSQL the rows every node of the claim statement's plan
    produced, all loops together (EXPLAIN ANALYZE), which counts each index entry a scan
    returned.
    """
    batch = 100
    steps = 0

    def step() -> int:
        nonlocal steps
        steps += 1
        return 0

    pg = db.dialect.name == "postgresql"
    async with db.connect() as conn:
        raw = await conn.get_raw_connection()
        if not pg:
            await raw.driver_connection.set_progress_handler(step, 100)
        try:
            async with conn.begin() as tx:
                if pg:
                    await conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
                    steps = await _claim_plan_rows(conn, clock, scope, batch)
                claimed = await Claimer("d", batch, timedelta(seconds=30)).claim(
                    conn, clock(), scope
                )
                await tx.rollback()
        finally:
            if not pg:
                await raw.driver_connection.set_progress_handler(None, 100)
    return len(claimed.rows), steps


async def _claim_plan_rows(conn, clock, scope: ClaimScope, batch: int) -> int:
    """Rows produced by every node of the statement Claimer.claim would run (PostgreSQL)."""
    per_type = await claimer._per_type_plan(conn, scope)
    pairs = bool(scope.paused_pairs)
    sql = claim_sql.claim_sql(
        "postgresql",
        claim_sql.ClaimShape(
            scoped=True,
            per_type=None if per_type is None else len(per_type),
            paused_pairs=pairs,
        ),
    )
    params = {
        **claim_sql.scope_params("postgresql", scope),
        **{f"type_{i}": name for i, name in enumerate(per_type or ())},
        "now": clock(),
        "locked_until": clock() + timedelta(seconds=30),
        "dispatcher_id": "d",
        "batch": batch,
        "key_cursor": "",
        "seq_floor": 0,
        "walk_limit": 4 * batch,
    }
    typed = [bindparam(k, type_=UtcDateTime()) for k in ("now", "locked_until")]
    arrays = ("scope_types", "scope_pairs") if pairs else ("scope_types",)
    typed += [bindparam(k, type_=ARRAY(Text)) for k in arrays]
    async with conn.begin_nested() as savepoint:
        stmt = text("EXPLAIN (ANALYZE, FORMAT JSON) " + sql).bindparams(*typed)
        plan = (await conn.execute(stmt, params)).scalar_one()
        await savepoint.rollback()

    def produced(node: dict) -> int:
        rows = int(node.get("Actual Rows", 0)) * int(node.get("Actual Loops", 1))
        return rows + sum(produced(child) for child in node.get("Plans", ()))

    return produced((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"])


async def test_a_scoped_claim_on_sqlite_searches_one_range_per_served_type(sqlite_url, clock):
    """The SQLite side of the test above, on a backlog: each served type's range is a
    SEARCH of ix_outbox_events_waiting_type by event_type, never a SCAN of it."""
    from engine import create_engine, create_schema

    db = create_engine(sqlite_url)
    try:
        await create_schema(db)
        await _fill_unserved_backlog(db, keys=50, behind=4)
        sql = claim_sql.claim_sql("sqlite", claim_sql.ClaimShape(scoped=True, per_type=2))
        params = {
            **claim_sql.scope_params("sqlite", ClaimScope(frozenset({"a", "b"}))),
            "type_0": "a",
            "type_1": "b",
            "now": clock(),
            "locked_until": clock(),
            "dispatcher_id": "d",
            "batch": 100,
            "key_cursor": "",
            "seq_floor": 0,
            "walk_limit": 400,
        }
        plan = await _text_plan(db, sql, params)
    finally:
        await db.dispose()
    _assert_no_table_scan(plan)
    ranges = [line for line in plan.splitlines() if "ix_outbox_events_waiting_type" in line]
    assert len(ranges) == 2, plan  # one per served type
    for line in ranges:
        assert line.startswith("SEARCH") and "(event_type=?" in line, plan
    assert "INDEX ix_outbox_events_waiting " not in plan, plan


async def test_the_key_walk_past_unserved_heads_costs_per_key_not_per_row_behind(db, clock):
    """Many keys whose heads nobody here serves, each with rows of a served type behind:
    the claim takes none of them (they wait behind their heads) and its work does not grow
    with the rows queued behind the heads (the walk probes one head per key)."""
    scope = ClaimScope(frozenset({"a"}))
    keys = 300
    await _fill_unserved_backlog(db, keys=keys, behind=5)
    claimed, shallow = await _claim_work(db, clock, scope)
    assert claimed == 0
    await _fill_unserved_backlog(db, keys=keys, behind=60, first=keys * 5)  # 12x as deep
    claimed, deep = await _claim_work(db, clock, scope)
    assert claimed == 0
    # 18,000 served rows wait behind the heads now, against 1,500 before: a walk that
    # visited them would cost ~12x; a walk over heads costs the same (index depth aside).
    assert deep < 1.5 * shallow, (shallow, deep)
    if db.dialect.name == "postgresql":
        assert deep < keys * 5 * 60 / 4, deep  # far fewer rows than wait behind the heads


@pytest.mark.postgresql
@pytest.mark.parametrize("keyed", ["no keys", "a third keyed"])
async def test_a_claim_on_a_large_backlog_is_never_jit_compiled(pg_url, clock, keyed):
    """PostgreSQL JIT-compiles a statement estimated above ``jit_above_cost``: several
    hundred ms per claim. The key walk's estimate passes it on a large backlog without
    ordering keys (1.2M for 1,000,000 rows: the 1M drain ran at a fifth of the 100k
    rate), so a claim turns JIT off for its own transaction. Checked where it matters: a
    plan in the claim's transaction, on a backlog whose estimate is over the threshold."""
    engine = create_engine(pg_url)
    await create_schema(engine)
    try:
        async with engine.begin() as conn:
            await conn.exec_driver_sql(
                "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, "
                "aggregate_type, aggregate_id, payload, ordering_key) "
                "SELECT 'e' || i, 't', 'x', 1, 'o', 'a', '{}', "
                f"CASE WHEN {'i % 3 = 0' if keyed != 'no keys' else 'false'} "
                "THEN 'k' || (i % 1000) END "
                "FROM generate_series(1, 300000) AS i"
            )
            await conn.exec_driver_sql("ANALYZE outbox_events")
        params = {
            "now": clock(),
            "locked_until": clock(),
            "dispatcher_id": "d",
            "batch": 500,
            "key_cursor": "",
            "seq_floor": 0,
            "walk_limit": 2000,
        }
        typed = [bindparam(k, type_=UtcDateTime()) for k in ("now", "locked_until")]
        claim = claim_sql.claim_sql("postgresql", claim_sql.ClaimShape())
        explain = text("EXPLAIN (FORMAT JSON) " + claim)
        explain = explain.bindparams(*typed)
        async with engine.begin() as conn:
            claimed = await Claimer("d", 500, timedelta(seconds=30)).claim(conn, clock())
            assert len(claimed.rows) == 500
            [plan] = (await conn.execute(explain, params)).scalar_one()
            assert "JIT" not in plan, plan["Plan"]["Total Cost"]
    finally:
        await engine.dispose()


async def _bound_plan(db, stmt, params: dict) -> str:
    """The plan of ``stmt`` with its parameters bound, as the driver runs it: on
    PostgreSQL the generic plan a prepared statement switches to after five runs."""
    compiled = stmt.compile(dialect=db.dialect)
    names = compiled.positiontup or []
    values = [params[n].isoformat(sep=" ") for n in names]
    async with db.connect() as conn:
        if db.dialect.name == "postgresql":
            await conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
            await conn.exec_driver_sql(f"PREPARE bound AS {compiled}")
            args = "(" + ", ".join(f"'{v}'" for v in values) + ")" if values else ""
            try:
                rows = (await conn.exec_driver_sql(f"EXPLAIN EXECUTE bound{args}")).all()
            finally:
                await conn.exec_driver_sql("DEALLOCATE bound")
                await conn.exec_driver_sql("RESET plan_cache_mode")
        else:
            rows = await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}", tuple(values))
        return "\n".join(str(r[-1]) for r in rows)


async def test_published_rows_are_counted_inside_the_published_at_index(db, clock):
    """The live overview's window, its two marks and the recount: never the status index
    (900,000 entries on a million rows), even with every timestamp a bound parameter."""
    window = insights.published_window_statements(db.dialect.name)
    now = clock()
    for stmt, params in (
        (window.since, {"since": now}),
        (window.before_capped, {"before": now}),
        (window.since_two, {"first": now, "second": now}),
        (window.totals, {"mark": now, "before": now}),
    ):
        plan = await _bound_plan(db, stmt, params)
        _assert_no_table_scan(plan)
        assert "ix_outbox_events_published_at" in plan, plan


async def _index_definitions(db) -> dict[str, str]:
    """Each index of the database by name: its CREATE INDEX statement."""
    if db.dialect.name == "postgresql":
        sql = "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'outbox_events'"
    else:
        sql = "SELECT name, sql FROM sqlite_master WHERE type = 'index'"
    async with db.connect() as conn:
        return dict((await conn.exec_driver_sql(sql)).all())


async def test_the_unordered_claim_indexes_leave_out_rows_in_flight(db):
    """A claim makes its rows publishing; the indexes it walks must not gain entries then."""
    found = await _index_definitions(db)
    for name in ("ix_outbox_events_waiting", "ix_outbox_events_waiting_type"):
        definition = found[name]
        assert "pending" in definition and "failed" in definition, definition
        assert "publishing" not in definition, definition


async def test_status_and_aggregate_indexes_leave_out_what_a_drain_writes_on_postgresql(db):
    """Claims (publishing) and completions (published) write no entry into the status
    index, claims none into the aggregate index; SQLite keeps both full (engine.storage.schema)."""
    found = await _index_definitions(db)
    status, aggregate = (
        found["ix_outbox_events_backlog_id"],
        found["ix_outbox_events_aggregate_at_rest"],
    )
    if db.dialect.name == "postgresql":
        assert "WHERE" in status and "'pending'" in status, status  # partial, not full
        assert "publish" not in status, status
        assert "<> 'publishing'" in aggregate, aggregate
    else:
        assert "WHERE" not in status and "WHERE" not in aggregate, (status, aggregate)


@pytest.mark.parametrize("status", ["pending", "failed", "dead_letter", "publishing", "published"])
async def test_a_page_and_a_count_of_one_status_read_an_index(db, status):
    """Backlog statuses through the status index, rows in flight through the lease
    index, published rows newest first along the primary key."""
    flt = EventFilter(statuses=(status,))
    page = filtered(select(*SUMMARY_COLUMNS), flt).order_by(t.c.id.desc()).limit(51)
    count = filtered(select(func.count()).select_from(t), flt)
    expected = ["ix_outbox_events_backlog_id", "ix_outbox_events_type_backlog"]
    if db.dialect.name == "postgresql" and status == "publishing":
        expected = ["ix_outbox_events_lease_expiry"]
    elif db.dialect.name == "postgresql" and status == "published":
        expected = ["outbox_events_pkey", "ix_outbox_events_published_at"]
    for stmt in (page, count):
        plan = await _plan(db, stmt)
        _assert_no_table_scan(plan)
        assert any(index in plan for index in expected), plan


async def test_the_aggregate_filter_reads_rows_at_rest_and_rows_in_flight_through_indexes(db):
    stmt = filtered(select(*SUMMARY_COLUMNS), EventFilter(aggregate_id="o-1"))
    plan = await _plan(db, stmt.order_by(t.c.id.desc()).limit(51))
    _assert_no_table_scan(plan)
    assert "ix_outbox_events_aggregate_at_rest" in plan, plan
    if db.dialect.name == "postgresql":
        assert "ix_outbox_events_lease_expiry" in plan, plan


async def _pending_then_analyzed(conn, count: int) -> None:
    """``count`` pending rows (ids ``e1``...), then ANALYZE: statistics that know of no
    row in flight and none published, as after a preload or a quiet hour."""
    await conn.exec_driver_sql(
        "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, "
        "aggregate_type, aggregate_id, payload) "
        "SELECT 'e' || i, 't', 'x', 1, 'o', 'a' || i, '{}' "
        f"FROM generate_series(1, {count}) AS i"
    )
    await conn.exec_driver_sql("ANALYZE outbox_events")


@pytest.mark.postgresql
async def test_the_retention_purge_reads_the_published_at_index_with_statistics_from_before_a_drain(
    pg_url, clock
):
    """Statistics taken while every row was pending (a backlog loaded, then drained before
    autovacuum analyzes again) make "published" look like one row; the planner then read
    every published row through (status, id) and sorted them, 54 ms a purge at 300,000.
    In the purge's transaction (retention.PURGE_PLAN) the published_at index serves it.
    Since 0.6 the status index holds no published row on PostgreSQL, so the plan without
    PURGE_PLAN reads the published_at index too; both must."""
    from engine.operating import retention

    engine = create_engine(pg_url)
    await create_schema(engine)
    try:
        async with engine.begin() as conn:
            await _pending_then_analyzed(conn, 20000)
            await conn.exec_driver_sql(
                "UPDATE outbox_events SET status = 'published', published_at = now()"
            )
        stmt = retention.purge_candidates(clock() - timedelta(days=7), 500)
        explain = "EXPLAIN " + _sql(engine, stmt.with_for_update(skip_locked=True))
        async with engine.begin() as conn:
            before = "\n".join(r[0] for r in await conn.exec_driver_sql(explain))
            await conn.execute(retention.PURGE_PLAN)
            plan = "\n".join(r[0] for r in await conn.exec_driver_sql(explain))
        for found in (before, plan):
            assert "ix_outbox_events_published_at" in found and "Sort" not in found, found
    finally:
        await engine.dispose()


async def test_the_completion_finds_each_claimed_row_through_an_index(db, clock):
    """One statement text for every batch on both databases (the claims travel as two
    strings, or as one JSON array on SQLite), and each claim is a probe, never a table
    scan."""
    if db.dialect.name == "postgresql":
        sql = fenced_writes._PUBLISH_PG.element.text
        claims = {"ids": "\x1fe-1\x1fe-2", "separator": "\x1f", "versions": "1,1"}
    else:
        sql = fenced_writes._PUBLISH_SQLITE.text
        claims = {"claims": json.dumps([["e-1", 1], ["e-2", 1]])}
    plan = await _text_plan(db, sql, {"now": clock(), "dispatcher_id": "d", **claims})
    _assert_no_table_scan(plan)
    if db.dialect.name == "sqlite":
        assert "USING INDEX ix_outbox_events_backlog_id (status=? AND id=?)" in plan, plan


@pytest.mark.postgresql
async def test_fenced_updates_probe_ids_whatever_the_statistics_say_of_rows_in_flight(
    pg_url, clock
):
    """Statistics taken while nothing was in flight (a preload, a quiet hour) say that
    almost no row is ``publishing``, leased, or held by anyone. A fenced update that let
    the planner use them walked an index range that also holds an entry for every row
    claimed since the last vacuum (a 1,000,000-event drain slowed by a third), or
    scanned the table for the holder's rows (a 10 ms-handler drain, whose completions
    are smaller, at 0.7 of its rate); the ids are what a fenced update must probe."""
    engine = create_engine(pg_url)
    await create_schema(engine)
    now = clock()
    try:
        async with engine.begin() as conn:
            await _pending_then_analyzed(conn, 20000)
            await conn.execute(
                text(
                    "UPDATE outbox_events SET status = 'publishing', locked_by = 'd', "
                    "locked_until = :until, claim_version = 1 "
                    "WHERE id IN (SELECT 'e' || i FROM generate_series(1, 300) AS i)"
                ).bindparams(bindparam("until", type_=UtcDateTime())),
                {"until": now + timedelta(seconds=30)},
            )
        fence = fenced_writes.Fence("d", now)
        one = (
            t.update()
            .where(t.c.id == "e1", t.c.claim_version == 1, fenced_writes._held(fence))
            .values(status="failed")
        )
        batch = fenced_writes._PUBLISH_PG.element.text
        ids = [f"e{i}" for i in range(1, 301)]
        joined, separator = fenced_writes.joined_ids(ids)
        versions = ",".join(["1"] * len(ids))
        params = {
            "now": now,
            "dispatcher_id": "d",
            "ids": joined,
            "separator": separator,
            "versions": versions,
        }
        typed = [bindparam("now", type_=UtcDateTime())]
        async with engine.connect() as conn:
            for mode in ("force_custom_plan", "force_generic_plan"):
                await conn.exec_driver_sql(f"SET plan_cache_mode = {mode}")
                explain = text("EXPLAIN " + batch).bindparams(*typed)
                plans = {
                    "batch": (await conn.execute(explain, params)).scalars().all(),
                    "one": (await conn.exec_driver_sql("EXPLAIN " + _sql(engine, one))).all(),
                }
                for name, rows in plans.items():
                    plan = "\n".join(str(r if isinstance(r, str) else r[0]) for r in rows)
                    assert "outbox_events_pkey" in plan, (mode, name, plan)
                    assert "Seq Scan on outbox_events" not in plan, (mode, name, plan)
                    assert "ix_outbox_events_backlog_id" not in plan, (mode, name, plan)
                    assert "ix_outbox_events_lease_expiry" not in plan, (mode, name, plan)
        async with engine.begin() as conn:
            done = await fenced_writes.mark_published(conn, [(i, 1) for i in ids], fence)
        assert done == set(ids)
    finally:
        await engine.dispose()
