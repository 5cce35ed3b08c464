"""Aggregates record domain events; the unit of work writes them before commit."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import AggregateRoot, EventRegistry, Ordering, unit_of_work
from engine.errors import DomainEventError, EventRegistrationError

from .conftest import CTX, rows


class Base(DeclarativeBase):
    pass


class Order(Base, AggregateRoot):
    __tablename__ = "test_domain_orders"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    state: Mapped[str] = mapped_column(String(20), default="new")

    def place(self) -> None:
        self.state = "placed"
        self.record_event(OrderPlaced(order_id=self.id, placed_at=datetime(2026, 1, 1, tzinfo=UTC)))


@dataclass(frozen=True)
class OrderPlaced:
    order_id: str
    placed_at: datetime


@dataclass(frozen=True)
class OrderShipped:
    order_id: str


@dataclass(frozen=True)
class Unmapped:
    order_id: str


@pytest.fixture
async def orders_db(db):
    async with db.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    return db


@pytest.fixture
def domain_registry() -> EventRegistry:
    reg = EventRegistry()
    reg.map_domain_event(
        OrderPlaced, event_type="orders.placed", event_version=1, aggregate_type="order"
    )
    reg.map_domain_event(
        OrderShipped,
        event_type="orders.shipped",
        aggregate_type="order",
        subject=lambda e: f"order/{e.order_id}",
    )
    return reg


async def test_placing_an_order_emits_the_event_without_publishing_code(orders_db, domain_registry):
    async with unit_of_work(orders_db, registry=domain_registry, context=CTX) as session:
        order = Order(id="o-1")
        session.add(order)
        order.place()
    [event] = await rows(orders_db)
    assert (event["event_type"], event["event_version"]) == ("orders.placed", 1)
    assert (event["aggregate_type"], event["aggregate_id"]) == ("order", "o-1")
    assert event["tenant_id"] == "acme"
    assert event["payload"] == {
        "order_id": "o-1",
        "placed_at": "2026-01-01T00:00:00+00:00",
        **CTX.envelope_fields(),
    }
    assert order.domain_events == ()  # cleared after the commit


async def test_a_mapping_carries_the_ordering_of_its_event_type(orders_db):
    registry = EventRegistry()
    registry.map_domain_event(
        OrderPlaced, event_type="orders.placed", aggregate_type="order", ordering=Ordering()
    )
    async with unit_of_work(orders_db, registry=registry, context=CTX) as session:
        order = Order(id="o-9")
        session.add(order)
        order.place()
    [event] = await rows(orders_db)
    assert event["ordering_key"] == "order:o-9"
    assert registry.dead_letter_policy("orders.placed") == "block"


async def test_loaded_aggregate_events_and_subject_selector(orders_db, domain_registry):
    async with unit_of_work(orders_db, registry=domain_registry, context=CTX) as session:
        session.add(Order(id="o-2"))
    async with unit_of_work(orders_db, registry=domain_registry, context=CTX) as session:
        order = await session.get(Order, "o-2")
        order.record_event(OrderShipped(order_id="o-2"))
        order.record_event(OrderShipped(order_id="o-2"))
    events = await rows(orders_db)
    assert [(e["event_type"], e["aggregate_id"]) for e in events] == [
        ("orders.shipped", "order/o-2"),
        ("orders.shipped", "order/o-2"),
    ]


async def test_unmapped_event_fails_the_commit_and_rolls_back(orders_db, domain_registry):
    order = Order(id="o-3")
    with pytest.raises(DomainEventError, match="Unmapped is not mapped"):
        async with unit_of_work(orders_db, registry=domain_registry, context=CTX) as session:
            session.add(order)
            order.record_event(OrderShipped(order_id="o-3"))
            order.record_event(Unmapped(order_id="o-3"))
    assert await rows(orders_db) == []
    async with unit_of_work(orders_db, registry=domain_registry, context=CTX) as session:
        assert await session.get(Order, "o-3") is None
    assert len(order.domain_events) == 2  # kept: the commit did not happen


async def test_events_without_a_task_context_fail_the_commit(orders_db, domain_registry):
    with pytest.raises(DomainEventError, match="no TaskContext"):
        async with unit_of_work(orders_db, registry=domain_registry) as session:
            order = Order(id="o-4")
            session.add(order)
            order.place()
    assert await rows(orders_db) == []


def test_mapping_a_class_twice_fails_at_registration(domain_registry):
    with pytest.raises(EventRegistrationError, match="mapped twice"):
        domain_registry.map_domain_event(
            OrderPlaced, event_type="orders.placed_again", aggregate_type="order"
        )


def test_buffer_is_bounded():
    order = Order(id="o-5")
    for _ in range(256):
        order.record_event(OrderShipped(order_id="o-5"))
    with pytest.raises(DomainEventError, match="buffer is full"):
        order.record_event(OrderShipped(order_id="o-5"))


async def test_an_aggregate_that_went_out_of_scope_still_emits_its_event(
    orders_db, domain_registry
):
    import gc

    async with unit_of_work(orders_db, registry=domain_registry, context=CTX) as session:
        session.add(Order(id="o-gc"))

    async def ship(session) -> None:  # the caller keeps no reference to the aggregate
        order = await session.get(Order, "o-gc")
        order.record_event(OrderShipped(order_id="o-gc"))

    async with unit_of_work(orders_db, registry=domain_registry, context=CTX) as session:
        await ship(session)
        gc.collect()
        await session.get(Order, "missing")  # any query: autoflush, identity map churn
    assert [e["event_type"] for e in await rows(orders_db)] == ["orders.shipped"]
