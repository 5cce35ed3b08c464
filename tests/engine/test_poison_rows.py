"""Rows that cannot be decoded: refused at INSERT where the database can, dead-lettered
alone (with the column named) where it cannot, and never in the way of other rows."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from engine import DispatchResult, OutboxDispatcher
from engine.operating.insights import EventFilter, OutboxInsights

from .conftest import row

# On SQLite, and on PostgreSQL through asyncpg and through psycopg 3.
pytestmark = pytest.mark.all_drivers

GOOD_PAYLOAD = (
    '{"order_id": "o-1", "amount": 5, "tenant_id": "acme", "actor_id": "u", "request_id": "r"}'
)
INSERT = (
    "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, aggregate_type, "
    "aggregate_id, payload{extra_cols}) VALUES (:id, 'acme', 'orders.placed', {version}, 'order', "
    "'o-1', :payload{extra_vals})"
)
sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def insert_sql(version: str = "1", **extra: str) -> str:
    cols = "".join(f", {name}" for name in extra)
    vals = "".join(f", {value}" for value in extra.values())
    return INSERT.format(extra_cols=cols, version=version, extra_vals=vals)


BAD_ROWS = {  # what a plain-SQL producer wrote -> the column the dead letter names
    "bad-version": (insert_sql(version="'v1'"), "column event_version is 'v1'"),
    "bad-created": (insert_sql(created_at="'yesterday'"), "column created_at"),
    "epoch-created": (insert_sql(created_at="1700000000"), "column created_at"),
    "bad-budget": (insert_sql(max_attempts="'x'"), "column max_attempts is 'x'"),
    "zero-budget": (insert_sql(max_attempts="0"), "column max_attempts is 0"),
}


@sqlite_only
async def test_each_corrupt_row_is_dead_lettered_alone_and_the_rest_goes_on(db, registry, clock):
    """SQLite tables made before this version's CHECKs accept these rows."""
    handled = []

    @registry.handler("orders.placed", key="orders.audit")
    async def audit(envelope):
        handled.append(envelope.event_id)

    async with db.begin() as conn:
        await conn.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
        for event_id, (sql, _why) in BAD_ROWS.items():
            await conn.execute(text(sql), {"id": event_id, "payload": GOOD_PAYLOAD})
        await conn.execute(text(insert_sql()), {"id": "good", "payload": GOOD_PAYLOAD})
        await conn.exec_driver_sql("PRAGMA ignore_check_constraints = OFF")

    insights = OutboxInsights(db, clock=clock)
    assert (await insights.overview()).counts["pending"] == 6  # stats still answers
    result = await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
    assert result == DispatchResult(claimed=6, published=1, dead_lettered=5)
    assert handled == ["good"]
    for event_id, (_sql, why) in BAD_ROWS.items():
        stored = await row(db, event_id)
        assert stored["status"] == "dead_letter"
        assert stored["dead_letter_reason"].startswith("corrupt row: ")
        assert why in stored["dead_letter_reason"]
    page = await insights.dead_letters()  # the console's and the CLI's list still answer
    assert {e.id for e in page.events} == set(BAD_ROWS)
    assert (await insights.event_detail("bad-created")).columns["created_at"] is None
    assert (await insights.events_page(EventFilter())).events


@sqlite_only
@pytest.mark.parametrize("event_id", sorted(BAD_ROWS))
async def test_sqlite_refuses_what_postgresql_column_types_would(db, event_id):
    sql, _why = BAD_ROWS[event_id]
    with pytest.raises(IntegrityError, match="CHECK constraint failed"):
        async with db.begin() as conn:
            await conn.execute(text(sql), {"id": event_id, "payload": GOOD_PAYLOAD})


@sqlite_only
async def test_sqlite_refuses_a_payload_that_is_not_json(db):
    with pytest.raises(IntegrityError, match="CHECK constraint failed"):
        async with db.begin() as conn:
            await conn.execute(text(insert_sql()), {"id": "x", "payload": "{not json"})


async def test_a_budget_below_one_is_refused_at_insert(db):
    with pytest.raises(IntegrityError):
        async with db.begin() as conn:
            await conn.execute(
                text(insert_sql(max_attempts="0")), {"id": "zero", "payload": GOOD_PAYLOAD}
            )


async def test_only_the_five_statuses_are_stored_at_insert_or_update(db):
    """The status CHECK (spelled as comparisons, for SQLite's sake) keeps its rule."""
    for status in ("pending", "publishing", "published", "failed", "dead_letter"):
        async with db.begin() as conn:
            await conn.execute(
                text(insert_sql(status=f"'{status}'")), {"id": status, "payload": GOOD_PAYLOAD}
            )
    for bad in ("'sent'", "''", "'PENDING'", "NULL"):
        with pytest.raises(IntegrityError):
            async with db.begin() as conn:
                await conn.execute(
                    text(insert_sql(status=bad)), {"id": "bad", "payload": GOOD_PAYLOAD}
                )
        with pytest.raises(IntegrityError):
            async with db.begin() as conn:
                await conn.execute(text(f"UPDATE outbox_events SET status = {bad}"))
    assert {(await row(db, s))["status"] for s in ("pending", "dead_letter")} == {
        "pending",
        "dead_letter",
    }


async def test_a_payload_nested_too_deeply_to_decode_is_dead_lettered_not_fatal(
    db, registry, clock
):
    """Valid JSON both databases store (SQLite's limit is 1,000 levels), that Python's
    decoder gives up on: the row is a dead letter naming why, the rest of its batch is
    delivered, and its detail (which a replay reads) still answers."""
    handled = []

    @registry.handler("orders.placed", key="orders.audit")
    async def audit(envelope):
        handled.append(envelope.event_id)

    deep = GOOD_PAYLOAD[:-1] + ', "deep": ' + "[" * 990 + "]" * 990 + "}"
    async with db.begin() as conn:
        await conn.execute(text(insert_sql()), {"id": "deep", "payload": deep})
        await conn.execute(text(insert_sql()), {"id": "good", "payload": GOOD_PAYLOAD})

    result = await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
    assert result == DispatchResult(claimed=2, published=1, dead_lettered=1)
    assert handled == ["good"]
    detail = await OutboxInsights(db, clock=clock).event_detail("deep")
    assert detail.columns["status"] == "dead_letter"
    assert detail.columns["dead_letter_reason"].startswith(
        "permanent: corrupt payload: nested too deeply to decode ("
    )
    assert detail.payload_error == "corrupt payload: nested too deeply to decode"
    assert detail.payload.count("[") == 990  # shown as stored (jsonb orders the keys)


async def test_a_payload_with_nan_is_corrupt_not_delivered(sqlite_url, registry, clock):
    """NaN and Infinity are no JSON (PostgreSQL's json type refuses them), but Python's
    decoder takes them, and an SQLite table from before the json_valid CHECK stores them:
    such a row is a corrupt payload, never a body consumers cannot parse."""
    from engine import create_engine, create_schema
    from tests.engine.test_migrations import make_previous_schema

    handled = []

    @registry.handler("orders.placed", key="orders.audit")
    async def audit(envelope):
        handled.append(envelope.event_id)

    db = create_engine(sqlite_url)
    try:
        await make_previous_schema(db)
        await create_schema(db)  # init-db upgrades it; SQLite keeps the table's CHECKs
        async with db.begin() as conn:
            for name, value in (("nan", "NaN"), ("inf", "-Infinity")):
                payload = GOOD_PAYLOAD[:-1] + f', "ratio": {value}}}'
                await conn.execute(text(insert_sql()), {"id": name, "payload": payload})
            await conn.execute(text(insert_sql()), {"id": "good", "payload": GOOD_PAYLOAD})
        await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
        assert "good" in handled and not {"nan", "inf"} & set(handled)
        for name, value in (("nan", "NaN"), ("inf", "-Infinity")):
            reason = (await row(db, name))["dead_letter_reason"]
            assert reason.startswith("permanent: corrupt payload: not valid JSON")
            assert f"{value} is not JSON" in reason
    finally:
        await db.dispose()


async def audited_rows(db, registry, *event_ids: str) -> list[str]:
    """Insert good rows with these ids by plain SQL; returns the list a handler fills with
    the ids it is called for."""
    handled: list[str] = []

    @registry.handler("orders.placed", key="orders.audit")
    async def audit(envelope):
        handled.append(envelope.event_id)

    async with db.begin() as conn:
        for event_id in event_ids:
            await conn.execute(text(insert_sql()), {"id": event_id, "payload": GOOD_PAYLOAD})
    return handled


@sqlite_only
async def test_an_id_holding_nul_is_completed_like_any_other(db, registry, clock):
    """SQLite text can hold NUL, and its JSON functions end a string there: the batch
    with such an id is completed with bound pairs, not lost as a lease."""
    handled = await audited_rows(db, registry, "odd\x00id", "plain")
    result = await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
    assert result == DispatchResult(claimed=2, published=2)
    assert sorted(handled) == ["odd\x00id", "plain"]
    assert (await row(db, "odd\x00id"))["status"] == "published"


@sqlite_only
async def test_a_row_whose_seq_was_nulled_by_hand_is_delivered_not_fatal(db, registry, clock):
    """SQLite leaves ``seq`` nullable (its trigger fills it); a row nulled by hand must not
    stop every claim that takes it."""
    handled = await audited_rows(db, registry, "nulled", "plain")
    async with db.begin() as conn:
        await conn.execute(text("UPDATE outbox_events SET seq = NULL WHERE id = 'nulled'"))
        # Claimed once, its lease since expired: the claim that takes it back reads no seq.
        await conn.execute(
            text(
                "UPDATE outbox_events SET status = 'publishing', locked_by = 'gone', "
                "locked_until = '2000-01-01 00:00:00.000000', attempt_count = 1, "
                "claim_version = 1 WHERE id = 'nulled'"
            )
        )
    dispatcher = OutboxDispatcher(db, registry, clock=clock)
    total = DispatchResult()
    for _ in range(3):
        total = total + await dispatcher.dispatch_once()
    assert total.published == 2 and sorted(handled) == ["nulled", "plain"]
