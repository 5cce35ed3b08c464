"""init-db upgrades tables an earlier version made; other entry points refuse them in one line."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import bindparam, func, inspect, select, text

from engine import DispatchResult, OutboxDispatcher, create_schema
from engine.clock import utc_now
from engine.dispatch.claimer import Claimer
from engine.errors import SchemaOutdatedError
from engine.inbox import InboxWriter, ReceivedMessage, RowBuilder, decode_message
from engine.operating import insights
from engine.operating.dispatch_health import KEY_UNFINISHED
from engine.storage.database import check_schema
from engine.storage.schema import UtcDateTime, metadata
from engine.storage.schema import outbox_events as t
from tests.inbox.corpus import LIMIT, STRUCTURED, encoded, event
from tests.old_schema import OLD_STATUSES, create_old_schema

from .conftest import rows
from .test_query_plans import _plan, _plan_without, _sql, key_index

OLD_ROW = (
    "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, aggregate_type, "
    "aggregate_id, payload) VALUES (:id, 'acme', 'orders.cancelled', 1, 'order', '1', "
    """'{"tenant_id": "acme", "actor_id": "u", "request_id": "r"}')"""
)


async def make_previous_schema(db) -> None:
    """Replace the fixture's tables with the ones version 0.1 made (tests/old_schema.py)."""
    async with db.begin() as conn:
        await conn.run_sync(metadata.drop_all)
    await create_old_schema(db.url.render_as_string(hide_password=False))


async def assert_refused_then_upgraded(db, missing: str, steps: list[str]) -> None:
    """Every entry point refuses the database in one line naming ``missing`` and init-db;
    init-db then takes exactly ``steps`` (in any order)."""
    with pytest.raises(SchemaOutdatedError, match="outbox-tui init-db") as caught:
        await check_schema(db)
    assert missing in str(caught.value)
    assert sorted(await create_schema(db)) == sorted(steps)


async def test_an_outdated_schema_is_refused_with_the_command_that_upgrades_it(db):
    await make_previous_schema(db)
    with pytest.raises(SchemaOutdatedError, match="outbox-tui init-db") as caught:
        await check_schema(db)
    assert "outbox_events.ordering_key" in str(caught.value)


async def test_init_db_upgrades_in_place_and_keeps_the_rows(db, registry, clock):
    await make_previous_schema(db)
    steps = await create_schema(db)
    assert "added outbox_events.seq" in steps
    assert "dropped index ix_outbox_events_active" in steps
    await check_schema(db)
    assert await create_schema(db) == []  # idempotent
    stored = await rows(db)
    assert len(stored) == len(OLD_STATUSES)
    assert all(r["seq"] is not None and r["ordering_key"] is None for r in stored)

    async with db.connect() as conn:
        indexes = await conn.run_sync(
            lambda sync: {i["name"] for i in inspect(sync).get_indexes("outbox_events")}
        )
    assert {"ix_outbox_events_waiting", key_index(db)} <= indexes
    retired = {"ix_outbox_events_active", "ix_outbox_events_lease", "ix_outbox_events_unordered"}
    assert not retired & indexes

    seen = []

    @registry.handler("orders.placed", key="orders.audit")
    async def audit(envelope):
        seen.append(envelope.event_id)

    worker = OutboxDispatcher(db, registry, clock=clock)
    pending = OLD_STATUSES.count("pending")
    assert await worker.dispatch_once() == DispatchResult(claimed=pending, published=pending)
    async with db.begin() as conn:  # new rows get a seq after the old ones
        await conn.execute(text(OLD_ROW), {"id": "new-1"})
        seqs = dict((await conn.execute(text("SELECT id, seq FROM outbox_events"))).all())
    assert seqs["new-1"] > max(v for k, v in seqs.items() if k != "new-1")


async def test_a_database_without_the_pause_tables_is_refused_then_upgraded(db):
    async with db.begin() as conn:  # a 0.2 database: no pause tables, no incident indexes
        await conn.execute(text("DROP TABLE outbox_pause_log"))
        await conn.execute(text("DROP TABLE outbox_pauses"))
        for index in ("ix_outbox_events_type_backlog", "ix_outbox_events_replayed_pending"):
            await conn.execute(text(f"DROP INDEX {index}"))
    with pytest.raises(SchemaOutdatedError) as caught:
        await check_schema(db)
    assert "table outbox_pauses" in str(caught.value)
    assert "table outbox_pause_log" in str(caught.value)
    steps = await create_schema(db)
    assert sorted(steps) == [
        "created index ix_outbox_events_replayed_pending",
        "created index ix_outbox_events_type_backlog",
        "created table outbox_pause_log",
        "created table outbox_pauses",
    ]
    await check_schema(db)
    async with db.connect() as conn:
        tables = await conn.run_sync(lambda sync: set(inspect(sync).get_table_names()))
    assert {"outbox_pauses", "outbox_pause_log"} <= tables


@pytest.mark.parametrize(
    "table",
    ["outbox_replay_log", "process_heartbeats", "outbox_handler_runs", "outbox_locks"],
)
async def test_a_table_dropped_by_hand_is_named_then_made_again_by_init_db(db, table):
    """Every command names the missing table and init-db; init-db makes it and says so
    (it used to fail on outbox_replay_log and call the others 'already present')."""
    async with db.begin() as conn:
        await conn.execute(text(f"DROP TABLE {table}"))
    with pytest.raises(SchemaOutdatedError, match=f"missing table {table}\\b"):
        await check_schema(db)
    assert await create_schema(db) == [f"created table {table}"]
    await check_schema(db)
    assert await create_schema(db) == []


async def test_a_database_with_the_unordered_indexes_of_0_3_is_refused_then_upgraded(
    db, registry, clock
):
    """0.3's unordered claim indexes held rows in flight too; 0.4's hold waiting rows only,
    and its lease index is spelled so the per-key in-flight probe cannot use it."""
    async with db.begin() as conn:
        for index in (
            "ix_outbox_events_waiting",
            "ix_outbox_events_waiting_type",
            "ix_outbox_events_lease_expiry",
        ):
            await conn.execute(text(f"DROP INDEX {index}"))
        await conn.execute(
            text(
                "CREATE INDEX ix_outbox_events_leased ON outbox_events (locked_until) "
                "WHERE locked_by IS NOT NULL"
            )
        )
        where = "status IN ('pending', 'publishing', 'failed') AND ordering_key IS NULL"
        await conn.execute(
            text(f"CREATE INDEX ix_outbox_events_unordered ON outbox_events (seq) WHERE {where}")
        )
        await conn.execute(
            text(
                "CREATE INDEX ix_outbox_events_unordered_type "
                f"ON outbox_events (event_type, seq) WHERE {where}"
            )
        )
        await conn.execute(text(OLD_ROW), {"id": "e1"})
    await assert_refused_then_upgraded(
        db,
        "index ix_outbox_events_waiting",
        [
            "created index ix_outbox_events_lease_expiry",
            "created index ix_outbox_events_waiting",
            "created index ix_outbox_events_waiting_type",
            "dropped index ix_outbox_events_leased",
            "dropped index ix_outbox_events_unordered",
            "dropped index ix_outbox_events_unordered_type",
        ],
    )
    await check_schema(db)
    assert await create_schema(db) == []

    @registry.handler("orders.cancelled", key="orders.audit")
    async def audit(envelope):
        pass

    worker = OutboxDispatcher(db, registry, clock=clock)
    assert await worker.dispatch_once() == DispatchResult(claimed=1, published=1)


async def test_a_database_with_the_full_status_and_aggregate_indexes_of_0_5_is_upgraded(db):
    """0.5's full (status, id) and (aggregate_id) indexes gained an entry on every claim
    and completion; 0.6 replaces them and init-db says so, keeping the rows."""
    async with db.begin() as conn:
        for index in ("ix_outbox_events_backlog_id", "ix_outbox_events_aggregate_at_rest"):
            await conn.execute(text(f"DROP INDEX {index}"))
        await conn.execute(
            text("CREATE INDEX ix_outbox_events_status_id ON outbox_events (status, id)")
        )
        await conn.execute(
            text("CREATE INDEX ix_outbox_events_aggregate_id ON outbox_events (aggregate_id)")
        )
        await conn.execute(text(OLD_ROW), {"id": "e1"})
    await assert_refused_then_upgraded(
        db,
        "index ix_outbox_events_backlog_id",
        [
            "created index ix_outbox_events_aggregate_at_rest",
            "created index ix_outbox_events_backlog_id",
            "dropped index ix_outbox_events_aggregate_id",
            "dropped index ix_outbox_events_status_id",
        ],
    )
    await check_schema(db)
    assert await create_schema(db) == []
    assert [r["id"] for r in await rows(db)] == ["e1"]


OLD_SPELLINGS = {  # 0.4's predicates, with IN lists
    "ix_outbox_events_type_backlog": (
        "(status, event_type, tenant_id) WHERE status IN ('pending', 'failed', 'dead_letter')"
    ),
    "ix_outbox_events_key_order": (
        "(ordering_key, seq) WHERE ordering_key IS NOT NULL AND "
        "(status IN ('pending', 'publishing', 'failed') "
        "OR (status = 'dead_letter' AND skipped_at IS NULL))"
    ),
}


async def test_indexes_spelled_with_in_lists_are_rebuilt_on_sqlite_and_kept_on_postgresql(db):
    """0.4 spelled two partial indexes' predicates with IN lists. SQLite only uses a partial
    index for queries that repeat its predicate as written, so init-db rebuilds them there;
    PostgreSQL proves either spelling from the other, so its indexes stay and serve (its
    key index is ix_outbox_events_key_turn since 0.8: test_key_turn_replaces_...)."""
    pg = db.dialect.name == "postgresql"
    old_spellings = {
        name: definition
        for name, definition in OLD_SPELLINGS.items()
        if not (pg and name == "ix_outbox_events_key_order")
    }
    async with db.begin() as conn:
        for name, definition in old_spellings.items():
            await conn.execute(text(f"DROP INDEX {name}"))
            await conn.execute(text(f"CREATE INDEX {name} ON outbox_events {definition}"))
    if db.dialect.name == "sqlite":
        with pytest.raises(SchemaOutdatedError, match="outbox-tui init-db") as caught:
            await check_schema(db)
        assert all(name in str(caught.value) for name in OLD_SPELLINGS)
        assert sorted(await create_schema(db)) == sorted(
            f"created index {n}" for n in OLD_SPELLINGS
        )
        async with db.connect() as conn:
            stored = dict((await conn.execute(text("SELECT name, sql FROM sqlite_master"))).all())
        assert not [n for n in OLD_SPELLINGS if "status IN" in stored[n]]
    await check_schema(db)
    assert await create_schema(db) == []
    backlog, _in_flight = insights.top_types_statements()
    # On PostgreSQL the status index has the same predicate: ask without it.
    plan = await _plan_without(db, "ix_outbox_events_backlog_id", _sql(db, backlog))
    assert "ix_outbox_events_type_backlog" in plan, plan
    behind_head = select(func.count()).where(t.c.ordering_key == "k", t.c.seq > 1, KEY_UNFINISHED)
    plan = await _plan(db, behind_head.select_from(t))
    assert key_index(db) in plan, plan


async def test_ordering_keys_under_the_default_collation_are_refused_then_made_bytewise(db):
    """0.6 compared ordering keys under the database's collation on PostgreSQL; 0.7 compares
    them bytewise (COLLATE "C"). init-db changes the column in place and keeps the rows,
    and the ordered claim still takes each key's head; SQLite has nothing to change."""
    pg = db.dialect.name == "postgresql"
    if pg:
        async with db.begin() as conn:
            await conn.execute(
                text(
                    "ALTER TABLE outbox_events ALTER COLUMN ordering_key "
                    'TYPE VARCHAR(400) COLLATE "default"'
                )
            )
    async with db.begin() as conn:
        for n, key in enumerate(["Zürich", "apple", "Zürich"]):
            await conn.execute(text(OLD_ROW), {"id": f"e{n}"})
            await conn.execute(
                text("UPDATE outbox_events SET ordering_key = :key WHERE id = :id"),
                {"key": key, "id": f"e{n}"},
            )
    if pg:
        await assert_refused_then_upgraded(
            db,
            'missing outbox_events.ordering_key COLLATE "C"',
            ['outbox_events.ordering_key compared bytewise (COLLATE "C")'],
        )
    await check_schema(db)
    assert await create_schema(db) == []
    async with db.connect() as conn:
        # Bytewise: "Z" (0x5A) sorts before "a" (0x61), as Python sorts them; most
        # language collations put "apple" first.
        keys = (
            await conn.execute(
                text("SELECT DISTINCT ordering_key FROM outbox_events ORDER BY ordering_key")
            )
        ).scalars()
        assert list(keys) == sorted({"Zürich", "apple"}) == ["Zürich", "apple"]
    async with db.begin() as conn:
        claimed = await Claimer("d", 10, timedelta(seconds=30)).claim(conn, utc_now())
    assert sorted(r.event_id for r in claimed.rows) == ["e0", "e1"]  # the heads only
    behind_head = select(func.count()).where(
        t.c.ordering_key == "Zürich", t.c.seq > 1, KEY_UNFINISHED
    )
    plan = await _plan(db, behind_head.select_from(t))
    assert key_index(db) in plan, plan


KEY_INDEXES_07 = {  # PostgreSQL's key indexes up to 0.7
    "ix_outbox_events_key_order": (
        "(ordering_key, seq) WHERE ordering_key IS NOT NULL AND "
        "(status = 'pending' OR status = 'publishing' OR status = 'failed' "
        "OR (status = 'dead_letter' AND skipped_at IS NULL))"
    ),
    "ix_outbox_events_key_in_flight": (
        "(ordering_key) WHERE ordering_key IS NOT NULL AND locked_by IS NOT NULL"
    ),
}


async def test_key_turn_replaces_the_key_order_and_in_flight_indexes_on_postgresql(db):
    """0.8: PostgreSQL's ordered claim reads one key index that holds a key's rows in
    flight first. init-db builds it and drops the two it replaces; SQLite keeps its two.
    Either way the claim takes heads only, and no head of a key with a row in flight."""
    pg = db.dialect.name == "postgresql"
    if pg:
        async with db.begin() as conn:
            await conn.execute(text("DROP INDEX ix_outbox_events_key_turn"))
            for name, definition in KEY_INDEXES_07.items():
                await conn.execute(text(f"CREATE INDEX {name} ON outbox_events {definition}"))
    keys = {"a0": "a", "a1": "a", "b0": "b", "c0": "c", "c1": "c"}
    async with db.begin() as conn:
        for event_id, key in keys.items():
            await conn.execute(text(OLD_ROW), {"id": event_id})
            await conn.execute(
                text("UPDATE outbox_events SET ordering_key = :key WHERE id = :id"),
                {"key": key, "id": event_id},
            )
        # c1 is in flight while c0, written before it, waits: c0 committed late, say.
        await conn.execute(
            text(
                "UPDATE outbox_events SET status = 'publishing', locked_by = 'other', "
                "locked_until = :until, claim_version = 1, attempt_count = 1 WHERE id = 'c1'"
            ).bindparams(bindparam("until", type_=UtcDateTime())),
            {"until": utc_now() + timedelta(minutes=5)},
        )
    if pg:
        await assert_refused_then_upgraded(
            db,
            "index ix_outbox_events_key_turn",
            [
                "created index ix_outbox_events_key_turn",
                "dropped index ix_outbox_events_key_in_flight",
                "dropped index ix_outbox_events_key_order",
            ],
        )
    await check_schema(db)
    assert await create_schema(db) == []
    async with db.connect() as conn:
        indexes = await conn.run_sync(
            lambda sync: {i["name"] for i in inspect(sync).get_indexes("outbox_events")}
        )
    on_sqlite = {"ix_outbox_events_key_order", "ix_outbox_events_key_in_flight"}
    assert ({"ix_outbox_events_key_turn"} if pg else on_sqlite) <= indexes
    assert not (on_sqlite if pg else {"ix_outbox_events_key_turn"}) & indexes
    async with db.begin() as conn:
        claimed = await Claimer("d", 10, timedelta(seconds=30)).claim(conn, utc_now())
    assert sorted(r.event_id for r in claimed.rows) == ["a0", "b0"]
    assert len(await rows(db)) == len(keys)


INBOX_COLUMNS = (
    "traceparent",
    "tracestate",
    "inbound_source",
    "inbound_id",
    "inbound_queue",
    "inbound_attributes",
    "inbound_body",
)
INBOX_INDEXES = ("uq_outbox_events_inbound", "ix_outbox_events_inbound_published")


async def test_the_inbox_columns_and_indexes_are_added_to_a_database_made_before_them(db, registry):
    """0.10: a database of the version before the inbox is refused, then upgraded in
    place; its rows stay local (no inbound identity), and the inbox deduplicates at once."""
    async with db.begin() as conn:  # the tables as the version before made them
        for index in INBOX_INDEXES:
            await conn.execute(text(f"DROP INDEX {index}"))
        for column in INBOX_COLUMNS:
            await conn.execute(text(f"ALTER TABLE outbox_events DROP COLUMN {column}"))
        await conn.execute(text(OLD_ROW), {"id": "before-1"})
    await assert_refused_then_upgraded(
        db,
        "outbox_events.inbound_id",
        [f"added outbox_events.{column}" for column in INBOX_COLUMNS]
        + [f"created index {index}" for index in INBOX_INDEXES],
    )
    await check_schema(db)
    assert await create_schema(db) == []
    [old] = await rows(db)
    assert old["id"] == "before-1"
    assert all(old[column] is None for column in INBOX_COLUMNS)

    writer, builder = InboxWriter(db), RowBuilder(registry, queue="q")
    for _ in range(2):
        message = ReceivedMessage(encoded(event("after-1")), STRUCTURED)
        await writer.write([builder.row(message, decode_message(message, max_bytes=LIMIT))])
    stored = await rows(db)
    assert len(stored) == 2
    assert [r["inbound_id"] for r in stored if r["id"] != "before-1"] == ["after-1"]
