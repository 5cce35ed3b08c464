"""Orders: a business table, domain events, handlers, and the ``register`` hook.

Placing an order writes the ``orders`` row; the aggregate records
``OrderPlaced`` and the unit of work turns it into an ``orders.placed`` outbox
row in the same transaction. There is no publishing code in ``place_order``.

The handlers stand in for real integrations and misbehave on purpose so a
demo shows every outbox state: amounts ending in 7 fail transiently on their
first two attempts (a flaky warehouse), and amounts over 900 are refused
permanently (a credit limit), which dead-letters them.

Both event types are ordered by their order (``key="aggregate"``): an order's
``orders.cancelled`` is never delivered before its ``orders.placed``, and a
dead-lettered ``orders.placed`` holds back its order's later events (a blocked
key) until an operator replays or skips it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import Numeric, String
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import (
    AggregateRoot,
    EventEnvelope,
    EventHandlerPermanentError,
    EventRegistry,
    EventSchemaSpec,
    TaskContext,
    run_event_side_effect,
    unit_of_work,
)

CREDIT_LIMIT = 900


class Base(DeclarativeBase):
    pass


@dataclass(frozen=True)
class OrderPlaced:
    order_id: str
    customer: str
    amount: int


@dataclass(frozen=True)
class OrderCancelled:
    order_id: str
    reason: str


class Order(Base, AggregateRoot):
    __tablename__ = "example_orders"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128))
    customer: Mapped[str] = mapped_column(String(200))
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2))
    state: Mapped[str] = mapped_column(String(20), default="placed")

    @classmethod
    def place(cls, tenant_id: str, customer: str, amount: int) -> Order:
        order = cls(
            id=str(uuid.uuid4()),
            tenant_id=tenant_id,
            customer=customer,
            amount=Decimal(amount),
            state="placed",
        )
        order.record_event(OrderPlaced(order.id, customer, amount))
        return order

    def cancel(self, reason: str) -> None:
        self.state = "cancelled"
        self.record_event(OrderCancelled(self.id, reason))


async def create_tables(engine: AsyncEngine) -> None:
    """Create the example's business table (the outbox tables come from create_schema)."""
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)


async def place_order(
    engine: AsyncEngine, registry: EventRegistry, context: TaskContext, customer: str, amount: int
) -> str:
    """The business operation: one order row and its event, in one transaction."""
    async with unit_of_work(engine, registry=registry, context=context) as session:
        order = Order.place(context.tenant_id, customer, amount)
        session.add(order)
    return order.id


async def cancel_order(
    engine: AsyncEngine, registry: EventRegistry, context: TaskContext, order_id: str, reason: str
) -> None:
    async with unit_of_work(engine, registry=registry, context=context) as session:
        order = await session.get(Order, order_id)
        if order is None:
            raise LookupError(f"no order {order_id}")
        order.cancel(reason)


# -- handlers --------------------------------------------------------------------------


async def reserve_stock(envelope: EventEnvelope) -> None:
    """Reserve stock at the (simulated) warehouse, once per event, via the side-effect helper."""
    amount = int(envelope.payload["amount"])
    if amount > CREDIT_LIMIT:
        raise EventHandlerPermanentError(f"amount {amount} exceeds the credit limit {CREDIT_LIMIT}")
    if amount % 10 == 7 and envelope.attempt_count <= 2:
        raise ConnectionError("warehouse API timed out")

    async def call_warehouse() -> dict[str, str]:
        return {"reservation": f"R-{envelope.event_id[-8:]}"}

    await run_event_side_effect(
        "warehouse.reserve",
        call_warehouse,
        request_payload={"order_id": envelope.payload["order_id"], "amount": amount},
    )


async def notify_customer(envelope: EventEnvelope) -> None:
    """Stand-in for an e-mail: nothing to do, but it is recorded as a handler run."""
    return None


def register(registry: EventRegistry) -> None:
    """The plugin contract: declare event types, map domain events, attach handlers."""
    registry.register_event(
        "orders.placed",
        1,
        EventSchemaSpec(required={"order_id": str, "customer": str, "amount": int}),
    )
    registry.register_event(
        "orders.cancelled", 1, EventSchemaSpec(required={"order_id": str, "reason": str})
    )
    registry.map_domain_event(
        OrderPlaced,
        event_type="orders.placed",
        event_version=1,
        aggregate_type="order",
        subject=lambda e: e.order_id,
    )
    registry.map_domain_event(
        OrderCancelled,
        event_type="orders.cancelled",
        event_version=1,
        aggregate_type="order",
        subject=lambda e: e.order_id,
    )
    for event_type in ("orders.placed", "orders.cancelled"):  # one order's events in order
        registry.set_ordering(event_type, key="aggregate")
    registry.register_handler("orders.placed", reserve_stock, key="orders.reserve_stock")
    registry.register_handler("orders.placed", notify_customer, key="orders.notify_customer")
    registry.register_handler("orders.cancelled", notify_customer, key="orders.notify_cancel")
