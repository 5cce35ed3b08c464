"""Installed app of the two-service scenario, for both services.

Service A publishes ``shop.order_placed`` (its relay serves every registered type).
Service B receives them through its inbox; a transactional handler inserts one
``b_orders`` row per event (no unique constraint: a second run would add a second row)
and publishes ``billing.invoice_requested`` in the same transaction; that follow-up's
transactional handler inserts one ``b_invoices`` row. ``b_orders.id`` counts up in
commit order, so a key's rows in id order are the order B handled them in.
``TWO_SERVICES_SLEEP_MS`` (``lo,hi``) paces each handler inside its transaction, so a kill
lands mid-handler.
"""

from __future__ import annotations

import asyncio
import os
import random

from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, insert
from sqlalchemy.ext.asyncio import AsyncSession

from engine import EventEnvelope, EventRegistry, OutboxEventPublisher

ORDER_PLACED, INVOICE_REQUESTED = "shop.order_placed", "billing.invoice_requested"
SLEEP_ENV = "TWO_SERVICES_SLEEP_MS"

business = MetaData()
b_orders = Table(
    "b_orders",
    business,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("event_id", String(36), nullable=False),
    Column("order_ref", String(100), nullable=False),  # A's aggregate id: one per A event
    Column("ordering_key", String(400)),
    Column("n", Integer, nullable=False),
)
b_invoices = Table(
    "b_invoices",
    business,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("event_id", String(36), nullable=False),
)


async def _pace() -> None:
    spec = os.environ.get(SLEEP_ENV, "")
    if spec:
        lo, hi = (float(part) for part in spec.split(","))
        await asyncio.sleep(random.uniform(lo, hi) / 1000)


async def record_order(envelope: EventEnvelope, session: AsyncSession) -> None:
    await session.execute(
        insert(b_orders).values(
            event_id=envelope.event_id,
            order_ref=envelope.aggregate_id,
            ordering_key=envelope.ordering_key,
            n=int(envelope.payload["n"]),
        )
    )
    await OutboxEventPublisher(session).publish(
        INVOICE_REQUESTED,
        {"order_ref": envelope.aggregate_id},
        aggregate_type="invoice",
        aggregate_id=envelope.aggregate_id,
    )
    await _pace()


async def record_invoice(envelope: EventEnvelope, session: AsyncSession) -> None:
    await session.execute(insert(b_invoices).values(event_id=envelope.event_id))
    await _pace()


def register(registry: EventRegistry) -> None:
    registry.register_event(ORDER_PLACED, 1)
    registry.register_event(INVOICE_REQUESTED, 1)
    registry.register_handler(ORDER_PLACED, record_order, key="b.orders", transactional=True)
    registry.register_handler(
        INVOICE_REQUESTED, record_invoice, key="b.invoices", transactional=True
    )
