"""Publishing from synchronous code: a sync Session or Connection, the same checks and rows.

Every test runs on SQLite (pysqlite) and on PostgreSQL through psycopg 3 and psycopg2; the
rows are delivered by the (async) dispatcher like any other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from engine import (
    AggregateRoot,
    DatabaseUrlError,
    EventRegistry,
    EventValidationError,
    OutboxDispatcher,
    OutboxEvent,
    OutboxTransactionError,
    SyncOutboxEventPublisher,
    create_engine,
    create_schema,
    create_sync_engine,
    sync_unit_of_work,
)
from engine.errors import DomainEventError, TenantMismatchError, UnknownEventTypeError
from engine.storage.schema import outbox_events

from .conftest import CTX, order_payload

business = MetaData()
orders = Table(
    "sync_orders", business, Column("id", String(36), primary_key=True), Column("amount", Integer)
)


class Base(DeclarativeBase):
    pass


class Order(Base, AggregateRoot):
    __tablename__ = "sync_domain_orders"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)


@dataclass(frozen=True)
class OrderPlaced:
    order_id: str


@dataclass(frozen=True)
class Unmapped:
    order_id: str


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("psycopg", marks=pytest.mark.postgresql),
        pytest.param("psycopg2", marks=pytest.mark.postgresql),
    ]
)
def urls(request, tmp_path) -> tuple[str, str]:
    """(async URL for the dispatcher, sync URL for the producer) of one fresh database."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path}/outbox.db", f"sqlite:///{tmp_path}/outbox.db"
    async_url = request.getfixturevalue("pg_url")
    sync_url = make_url(async_url).set(drivername=f"postgresql+{request.param}")
    return async_url, sync_url.render_as_string(hide_password=False)


@pytest.fixture
async def databases(urls) -> AsyncIterator[tuple[str, Engine]]:
    """(async URL for the dispatcher, sync engine for the producer), with the tables."""
    async_url, sync_url = urls
    await create_schema(async_url)
    sync_engine = create_sync_engine(sync_url)
    business.create_all(sync_engine)
    Base.metadata.create_all(sync_engine)
    try:
        yield async_url, sync_engine
    finally:
        sync_engine.dispose()


@pytest.fixture
def sync_db(databases) -> Engine:
    return databases[1]


def stored(engine: Engine) -> list[dict[str, object]]:
    with engine.connect() as conn:
        return [
            dict(r)
            for r in conn.execute(select(outbox_events).order_by(outbox_events.c.seq)).mappings()
        ]


def business_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(orders)).scalar_one())


async def test_a_sync_unit_commits_the_row_and_the_event_and_a_dispatcher_delivers_it(
    databases, registry
):
    async_url, sync_db = databases
    with sync_unit_of_work(sync_db, registry=registry, context=CTX) as session:
        session.execute(insert(orders).values(id="o-1", amount=10))
        event_id = SyncOutboxEventPublisher(session).publish(
            "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
        )
    [row] = stored(sync_db)
    assert row["id"] == event_id and row["status"] == "pending"
    assert row["payload"] == {
        **order_payload(),
        "tenant_id": "acme",
        "actor_id": "user-1",
        "request_id": "req-1",
        "trace_id": "trace-abc",
    }
    assert business_rows(sync_db) == 1

    seen = []

    @registry.handler("orders.placed", key="test.seen")
    async def handle(envelope):
        seen.append((envelope.event_id, envelope.payload["order_id"], envelope.tenant_id))

    dispatch_engine = create_engine(async_url)
    try:
        result = await OutboxDispatcher(dispatch_engine, registry).dispatch_once()
    finally:
        await dispatch_engine.dispose()
    assert (result.claimed, result.published) == (1, 1)
    assert seen == [(event_id, "o-1", "acme")]
    assert stored(sync_db)[0]["status"] == "published"


def test_a_rollback_leaves_neither_the_row_nor_the_event(sync_db, registry):
    with (
        pytest.raises(RuntimeError),
        sync_unit_of_work(sync_db, registry=registry, context=CTX) as s,
    ):
        s.execute(insert(orders).values(id="o-1", amount=10))
        SyncOutboxEventPublisher(s).publish(
            "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
        )
        raise RuntimeError("business failure")
    assert stored(sync_db) == [] and business_rows(sync_db) == 0


def test_publishing_outside_a_transaction_is_refused(sync_db, registry):
    with (
        Session(sync_db) as session,
        pytest.raises(OutboxTransactionError, match="inside an active transaction"),
    ):
        SyncOutboxEventPublisher(session, registry).publish(
            "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
        )
    with sync_db.connect() as conn, pytest.raises(OutboxTransactionError):
        SyncOutboxEventPublisher(conn, registry).publish(
            "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
        )
    assert stored(sync_db) == []


@pytest.mark.parametrize(
    ("event_type", "version", "payload", "tenant", "error"),
    [
        ("orders.unknown", 1, order_payload(), None, UnknownEventTypeError),
        ("orders.placed", 2, order_payload(), None, UnknownEventTypeError),
        ("orders.placed", 1, {"order_id": "o-1"}, None, EventValidationError),
        ("orders.placed", 1, order_payload(amount="ten"), None, EventValidationError),
        ("orders.placed", 1, order_payload(), "globex", TenantMismatchError),
        ("orders.placed", 1, order_payload(blob={1, 2}), None, EventValidationError),
    ],
)
def test_the_same_checks_as_the_async_publisher(
    sync_db, registry, event_type, version, payload, tenant, error
):
    with (
        pytest.raises(error),
        sync_unit_of_work(sync_db, registry=registry, context=CTX) as session,
    ):
        session.execute(insert(orders).values(id="o-1", amount=10))
        SyncOutboxEventPublisher(session).publish(
            event_type,
            {**payload, "tenant_id": "acme"} if tenant else payload,
            aggregate_type="order",
            aggregate_id="o-1",
            event_version=version,
            tenant_id=tenant,
        )
    assert stored(sync_db) == [] and business_rows(sync_db) == 0


def test_a_connection_in_a_transaction_publishes_with_an_explicit_registry(sync_db, registry):
    with sync_db.begin() as conn:
        ids = SyncOutboxEventPublisher(conn, registry).publish_many(
            [
                OutboxEvent(
                    "orders.cancelled",
                    {"tenant_id": "acme", "actor_id": "a", "request_id": "r"},
                    "order",
                    f"o-{n}",
                    tenant_id="acme",
                    max_attempts=3 if n == 1 else None,
                )
                for n in range(3)
            ]
        )
    rows = stored(sync_db)
    assert [r["id"] for r in rows] == ids  # write order is seq order
    assert [r["max_attempts"] for r in rows] == [10, 3, 10]
    with sync_db.connect() as conn, pytest.raises(OutboxTransactionError, match="EventRegistry"):
        SyncOutboxEventPublisher(conn)


def test_domain_events_become_rows_in_a_sync_unit(sync_db):
    registry = EventRegistry()
    registry.map_domain_event(
        OrderPlaced,
        event_type="orders.placed",
        aggregate_type="order",
        subject=lambda e: e.order_id,
    )
    with sync_unit_of_work(sync_db, registry=registry, context=CTX) as session:
        order = Order(id="o-7")
        session.add(order)
        order.record_event(OrderPlaced("o-7"))
    [row] = stored(sync_db)
    assert (row["event_type"], row["aggregate_id"], row["tenant_id"]) == (
        "orders.placed",
        "o-7",
        "acme",
    )
    assert order.domain_events == ()  # cleared once committed
    with (
        pytest.raises(DomainEventError, match="not mapped"),
        sync_unit_of_work(sync_db, registry=registry, context=CTX) as session,
    ):
        other = Order(id="o-8")
        session.add(other)
        other.record_event(Unmapped("o-8"))
    assert len(stored(sync_db)) == 1
    with Session(sync_db) as session:
        assert session.get(Order, "o-8") is None  # the aggregate rolled back with it


def test_a_failed_inner_unit_dooms_the_outer_one_even_if_caught(sync_db, registry):
    with (
        pytest.raises(OutboxTransactionError, match="inner sync_unit_of_work failed"),
        sync_unit_of_work(sync_db, registry=registry, context=CTX) as outer,
    ):
        SyncOutboxEventPublisher(outer).publish(
            "orders.placed", order_payload(), aggregate_type="order", aggregate_id="o-1"
        )
        try:
            with sync_unit_of_work(sync_db, registry=registry, context=CTX) as inner:
                assert inner is outer
                raise ValueError("inner failure")
        except ValueError:
            pass
    assert stored(sync_db) == []


def test_sync_urls_are_checked(tmp_path):
    with pytest.raises(DatabaseUrlError, match="unsupported sync database URL scheme"):
        create_sync_engine("mysql://u:secret@h/db")
    with pytest.raises(DatabaseUrlError, match="in-memory"):
        create_sync_engine("sqlite://")
    assert create_sync_engine(f"sqlite:///{tmp_path}/x.db").url.drivername == "sqlite+pysqlite"
    assert create_sync_engine("postgresql://u:p@h/db").url.drivername == "postgresql+psycopg2"
