"""Writing events: same transaction as the business data, validated at publish."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, event, func, insert, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import (
    EventValidationError,
    OutboxEventPublisher,
    OutboxTransactionError,
    unit_of_work,
)
from engine.errors import TenantMismatchError, UnknownEventTypeError
from engine.storage.schema import outbox_events

from .conftest import CTX, order_payload, rows

# Every test here on SQLite, on PostgreSQL through asyncpg and through psycopg 3.
pytestmark = pytest.mark.all_drivers


@contextlib.contextmanager
def statements_run(db) -> Iterator[list[str]]:
    """The statements SQLAlchemy sends while the block runs (what engine listeners see)."""
    statements: list[str] = []

    def record(_conn, _cursor, statement, *_args):
        statements.append(statement.split("(")[0].strip())

    event.listen(db.sync_engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(db.sync_engine, "before_cursor_execute", record)


business = MetaData()
orders = Table(
    "test_orders", business, Column("id", String(36), primary_key=True), Column("amount", Integer)
)


async def _create_orders(db):
    async with db.begin() as conn:
        await conn.run_sync(business.create_all)


async def test_commit_writes_business_row_and_event_together(db, registry):
    await _create_orders(db)
    async with unit_of_work(db, registry=registry, context=CTX) as session:
        await session.execute(insert(orders).values(id="o-1", amount=10))
        event_id = await OutboxEventPublisher(session).publish(
            "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
        )
    [event] = await rows(db)
    assert event["id"] == event_id
    assert event["status"] == "pending"
    assert event["tenant_id"] == "acme"
    assert event["payload"] == {
        "order_id": "o-1",
        "amount": 10,
        "tenant_id": "acme",
        "actor_id": "user-1",
        "request_id": "req-1",
        "trace_id": "trace-abc",
    }
    assert event["claim_version"] == 0 and event["attempt_count"] == 0
    assert event["max_attempts"] == 10
    assert event["created_at"].tzinfo is not None


async def test_rollback_leaves_no_event_and_no_business_row(db, registry):
    await _create_orders(db)
    with pytest.raises(RuntimeError, match="boom"):
        async with unit_of_work(db, registry=registry, context=CTX) as session:
            await session.execute(insert(orders).values(id="o-1", amount=10))
            await OutboxEventPublisher(session).publish(
                "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
            )
            raise RuntimeError("boom")
    assert await rows(db) == []
    async with db.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(orders))).scalar() == 0


async def test_nested_unit_of_work_reuses_the_outer_transaction(db, registry):
    with pytest.raises(RuntimeError):
        async with unit_of_work(db, registry=registry, context=CTX) as outer:
            async with unit_of_work(db, registry=registry, context=CTX) as inner:
                assert inner is outer
                await OutboxEventPublisher(inner).publish(
                    "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
                )
            raise RuntimeError("outer fails after the inner block finished")
    assert await rows(db) == []


async def test_publish_outside_a_transaction_raises(db, registry):
    from sqlalchemy.ext.asyncio import AsyncSession

    async with AsyncSession(db) as session:
        publisher = OutboxEventPublisher(session, registry)
        with pytest.raises(OutboxTransactionError, match="inside an active transaction"):
            await publisher.publish(
                "orders.placed",
                order_payload(**CTX.envelope_fields()),
                aggregate_type="order",
                aggregate_id="o-1",
                tenant_id="acme",
            )
    assert await rows(db) == []


@pytest.mark.parametrize(
    ("event_type", "version", "payload", "error", "message"),
    [
        ("orders.shipped", 1, order_payload(), UnknownEventTypeError, "not registered"),
        ("orders.placed", 2, order_payload(), UnknownEventTypeError, r"registered versions: \[1\]"),
        ("orders.placed", 1, {"order_id": "o-1"}, EventValidationError, "missing required field"),
        (
            "orders.placed",
            1,
            order_payload(amount="ten"),
            EventValidationError,
            "'amount' must be int, got str",
        ),
        ("orders.placed", 1, order_payload(amount=True), EventValidationError, "must be int"),
        ("orders.placed", 1, order_payload(note=5), EventValidationError, "'note' must be str"),
        (
            "orders.placed",
            1,
            order_payload(tenant_id="globex"),
            TenantMismatchError,
            "does not match the event's tenant 'acme'",
        ),
        ("orders.cancelled", 1, {"request_id": 7}, EventValidationError, "'request_id' must be"),
        ("orders.placed", 1, order_payload(blob=object()), EventValidationError, "JSON"),
    ],
)
async def test_invalid_events_are_rejected_at_publish(
    db, registry, event_type, version, payload, error, message
):
    with pytest.raises(error, match=message):
        async with unit_of_work(db, registry=registry, context=CTX) as session:
            await OutboxEventPublisher(session).publish(
                event_type,
                payload,
                event_version=version,
                aggregate_type="order",
                aggregate_id="o-1",
            )
    assert await rows(db) == []


async def test_payload_must_carry_tenant_actor_and_request_without_a_context(db, registry):
    with pytest.raises(EventValidationError, match="missing required field 'actor_id'"):
        async with unit_of_work(db, registry=registry) as session:
            await OutboxEventPublisher(session).publish(
                "orders.placed",
                order_payload(tenant_id="acme", request_id="r"),
                aggregate_type="order",
                aggregate_id="o-1",
                tenant_id="acme",
            )


async def test_publish_many_writes_all_rows_with_time_ordered_ids(db, registry):
    from engine.writing.publisher import OutboxEvent

    drafts = [
        OutboxEvent("orders.placed", order_payload(f"o-{i}"), "order", f"o-{i}") for i in range(50)
    ]
    async with unit_of_work(db, registry=registry, context=CTX) as session:
        ids = await OutboxEventPublisher(session).publish_many(drafts)
    assert ids == sorted(ids) and len(set(ids)) == 50
    stored = await rows(db)
    assert [r["aggregate_id"] for r in stored] == [f"o-{i}" for i in range(50)]


async def test_a_row_inserted_with_plain_sql_gets_every_default(db):
    """The table contract: other languages enqueue with a plain INSERT."""
    async with db.begin() as conn:
        await conn.exec_driver_sql(
            "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, aggregate_type,"
            " aggregate_id, payload) VALUES ('0190a8e0-0000-7000-8000-000000000001', 'acme',"
            " 'orders.placed', 1, 'order', 'o-9', '{\"order_id\": \"o-9\"}')"
        )
    [event] = await rows(db)
    assert event["status"] == "pending"
    assert (event["claim_version"], event["attempt_count"], event["max_attempts"]) == (0, 0, 10)
    assert event["next_retry_at"] is None and event["locked_until"] is None
    assert event["created_at"].tzinfo is not None
    assert event["replay_count"] == 0


async def test_status_column_rejects_unknown_states(db):
    from sqlalchemy.exc import IntegrityError

    with pytest.raises(IntegrityError):
        async with db.begin() as conn:
            await conn.execute(
                insert(outbox_events).values(
                    id="x",
                    tenant_id="t",
                    event_type="e",
                    event_version=1,
                    aggregate_type="a",
                    aggregate_id="1",
                    payload={},
                    status="done",
                )
            )


async def test_a_failed_inner_unit_dooms_the_outer_one_even_if_caught(db, registry):
    with pytest.raises(OutboxTransactionError, match="inner unit_of_work failed"):
        async with unit_of_work(db, registry=registry, context=CTX) as outer:
            await OutboxEventPublisher(outer).publish(
                "orders.placed", order_payload("o-1"), aggregate_type="order", aggregate_id="o-1"
            )
            try:
                async with unit_of_work(db, registry=registry, context=CTX) as inner:
                    await OutboxEventPublisher(inner).publish(
                        "orders.placed",
                        order_payload("o-2"),
                        aggregate_type="order",
                        aggregate_id="o-2",
                    )
                    raise RuntimeError("inner step failed")
            except RuntimeError:
                pass  # the caller recovers, but the transaction must not commit half a story
    assert await rows(db) == []


async def test_a_task_started_inside_a_unit_gets_its_own_unit(db, registry):
    import asyncio

    async def background(order_id: str) -> None:
        await asyncio.sleep(0.05)  # runs on after the outer unit has committed and closed
        async with unit_of_work(db, registry=registry, context=CTX) as session:
            await OutboxEventPublisher(session).publish(
                "orders.placed",
                order_payload(order_id),
                aggregate_type="order",
                aggregate_id=order_id,
            )

    async with unit_of_work(db, registry=registry, context=CTX) as session:
        await OutboxEventPublisher(session).publish(
            "orders.placed", order_payload("o-1"), aggregate_type="order", aggregate_id="o-1"
        )
        task = asyncio.create_task(background("o-2"))
    await task
    assert sorted(r["aggregate_id"] for r in await rows(db)) == ["o-1", "o-2"]
    async with db.begin() as conn:  # nothing left holding a transaction (SQLite write lock)
        await conn.exec_driver_sql("DELETE FROM outbox_events WHERE aggregate_id = 'nobody'")


# On PostgreSQL a publish that follows another statement of its transaction inserts on the
# session's asyncpg connection (engine.writing.publisher._insert_on_driver); one that opens the
# transaction goes through session.execute, which begins it. Both ways, on both databases:
LEADS = ["publish first", "after a business write"]


async def _lead(session, lead: str) -> None:
    if lead == "after a business write":
        await session.execute(insert(orders).values(id="lead", amount=1))


@pytest.mark.parametrize("lead", LEADS)
@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_events_commit_and_roll_back_with_the_unit_either_way(db, registry, lead, outcome):
    from engine.writing.publisher import OutboxEvent

    await _create_orders(db)
    drafts = [
        OutboxEvent("orders.placed", order_payload(f"o-{i}"), "order", f"o-{i}") for i in (1, 2)
    ]
    with pytest.raises(RuntimeError) if outcome == "rollback" else _no_error():
        async with unit_of_work(db, registry=registry, context=CTX) as session:
            await _lead(session, lead)
            single = await OutboxEventPublisher(session).publish(
                "orders.placed", order_payload("o-0"), aggregate_type="order", aggregate_id="o-0"
            )
            many = await OutboxEventPublisher(session).publish_many(drafts)
            if outcome == "rollback":
                raise RuntimeError("the business step failed")
    stored = sorted(await rows(db), key=lambda r: r["seq"])
    async with db.connect() as conn:
        business_rows = (await conn.execute(select(func.count()).select_from(orders))).scalar()
    if outcome == "rollback":
        assert stored == [] and business_rows == 0
        return
    assert [r["id"] for r in stored] == [single, *many]
    assert business_rows == (1 if lead == "after a business write" else 0)
    first = stored[0]
    assert first["payload"] == {**order_payload("o-0"), **CTX.envelope_fields()}
    assert (first["status"], first["max_attempts"], first["ordering_key"]) == ("pending", 10, None)
    assert first["created_at"].tzinfo is not None


class _no_error:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_exc: object) -> bool:
        return False


@pytest.mark.parametrize("lead", LEADS)
async def test_publish_many_keeps_write_order_when_only_some_events_set_max_attempts(
    db, registry, lead
):
    """Rows with and without max_attempts need different column lists; order must hold."""
    from engine.writing.publisher import OutboxEvent

    await _create_orders(db)
    registry.set_ordering("orders.cancelled")
    budgets = [None, 3, 3, None, 7, None]
    drafts = [
        OutboxEvent("orders.placed", order_payload(f"o-{i}"), "order", f"o-{i}", max_attempts=b)
        for i, b in enumerate(budgets)
    ]
    drafts += [
        OutboxEvent("orders.cancelled", {}, "order", "o-1"),
        OutboxEvent("orders.placed", order_payload("o-9"), "order", "o-9", ordering_key="k-9"),
    ]
    async with unit_of_work(db, registry=registry, context=CTX) as session:
        await _lead(session, lead)
        ids = await OutboxEventPublisher(session).publish_many(drafts)
    stored = sorted(await rows(db), key=lambda r: r["seq"])
    assert [r["id"] for r in stored] == ids
    assert [r["aggregate_id"] for r in stored] == [f"o-{i}" for i in range(len(budgets))] + [
        "o-1",
        "o-9",
    ]
    assert [r["max_attempts"] for r in stored] == [10 if b is None else b for b in budgets] + [
        10,
        10,
    ]
    assert [r["ordering_key"] for r in stored] == [None] * len(budgets) + ["order:o-1", "k-9"]


@pytest.mark.parametrize("lead", LEADS)
async def test_a_non_json_payload_and_a_database_error_are_raised_as_before(
    db, registry, lead, monkeypatch
):
    """EventValidationError for a payload json cannot encode; a driver error comes as
    SQLAlchemy's own exception class (here IntegrityError: an id used twice), and the whole
    unit rolls back."""
    from sqlalchemy.exc import IntegrityError

    await _create_orders(db)
    with pytest.raises(EventValidationError, match="not JSON-serialisable"):
        async with unit_of_work(db, registry=registry, context=CTX) as session:
            await _lead(session, lead)
            await OutboxEventPublisher(session).publish(
                "orders.placed",
                order_payload(blob={1, 2}),
                aggregate_type="order",
                aggregate_id="o-1",
            )
    monkeypatch.setattr(
        "engine.writing.publisher.uuid7", lambda: "0190a8e0-0000-7000-8000-00000000000d"
    )
    async with unit_of_work(db, registry=registry, context=CTX) as session:
        await OutboxEventPublisher(session).publish(
            "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
        )
    with pytest.raises(IntegrityError):
        async with unit_of_work(db, registry=registry, context=CTX) as session:
            await _lead(session, lead)
            await OutboxEventPublisher(session).publish(
                "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-2"
            )
    assert [r["aggregate_id"] for r in await rows(db)] == ["o-1"]
    async with db.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(orders))).scalar() == 0


class _FlushedBase(DeclarativeBase):
    pass


class _FlushedOrder(_FlushedBase):
    __tablename__ = "test_flushed_orders"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)


@pytest.mark.parametrize("lead", LEADS)
async def test_publish_flushes_pending_objects_before_its_insert(db, registry, lead):
    """The aggregate's own write (and its row lock) goes before the event's INSERT.

    SQLite: the statements seen by an engine listener. PostgreSQL: the INSERT after a
    business write bypasses SQLAlchemy's execution, so listeners do not see it; there the
    rows' command ids within their transaction (``cmin``) give the order instead.
    """
    from sqlalchemy import text

    await _create_orders(db)
    async with db.begin() as conn:
        await conn.run_sync(_FlushedBase.metadata.create_all)
    with statements_run(db) as statements:
        async with unit_of_work(db, registry=registry, context=CTX) as session:
            await _lead(session, lead)
            session.add(_FlushedOrder(id="o-1"))
            await OutboxEventPublisher(session).publish(
                "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
            )
    assert len(await rows(db)) == 1
    inserts = [s for s in statements if s.startswith("INSERT") and "test_orders" not in s]
    if db.dialect.name == "sqlite":
        assert inserts == ["INSERT INTO test_flushed_orders", "INSERT INTO outbox_events"]
        return
    async with db.connect() as conn:
        order = (await conn.execute(text("SELECT xmin, cmin FROM test_flushed_orders"))).one()
        outbox = (await conn.execute(text("SELECT xmin, cmin FROM outbox_events"))).one()
    assert order.xmin == outbox.xmin and int(order.cmin) < int(outbox.cmin)
    assert inserts == ["INSERT INTO test_flushed_orders"]  # the flush began the transaction


async def test_a_schema_translate_map_keeps_the_insert_in_sqlalchemy(db, registry):
    """Only SQLAlchemy's compiler applies schema_translate_map: with one set, the INSERT
    goes through session.execute on PostgreSQL too (engine listeners see it)."""
    await _create_orders(db)
    translated = db.execution_options(schema_translate_map={None: None})
    with statements_run(db) as statements:
        async with unit_of_work(translated, registry=registry, context=CTX) as session:
            await _lead(session, "after a business write")
            await OutboxEventPublisher(session).publish(
                "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
            )
    tables = [s.split()[-1].split(".")[-1] for s in statements if s.startswith("INSERT")]
    assert tables == ["test_orders", "outbox_events"]  # the translated name may carry a schema
    assert [r["aggregate_id"] for r in await rows(db)] == ["o-1"]
