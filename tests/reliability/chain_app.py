"""Installed app of the exactly-once scenario: a transactional chain of two events.

``chain.order`` -> a transactional handler inserts one ``chain_invoices`` row (no unique
constraint: a second run would add a second row) and publishes ``chain.invoice`` in the
same transaction; ``chain.invoice`` -> a transactional handler inserts one
``chain_receipts`` row. ``CHAIN_APP_SLEEP_MS`` (a range ``lo,hi``) paces each handler
inside its transaction, so a kill or a stall lands mid-handler.

``CHAIN_APP_MUTANT=1`` is the mutation check: the same writes from plain handlers, each
committing its own unit of work, so the writes and the record that they ran commit in
separate transactions; the scenario's proof must then find duplicates.
"""

from __future__ import annotations

import asyncio
import os
import random

from sqlalchemy import Column, MetaData, String, Table, insert
from sqlalchemy.ext.asyncio import AsyncSession

from engine import (
    EventEnvelope,
    EventRegistry,
    OutboxEventPublisher,
    create_engine,
    unit_of_work,
)

ORDER, INVOICE = "chain.order", "chain.invoice"
MUTANT_ENV, SLEEP_ENV = "CHAIN_APP_MUTANT", "CHAIN_APP_SLEEP_MS"

business = MetaData()
invoices = Table(
    "chain_invoices", business, Column("event_id", String(36)), Column("key", String(100))
)
receipts = Table("chain_receipts", business, Column("event_id", String(36)))


async def _pace() -> None:
    spec = os.environ.get(SLEEP_ENV, "")
    if spec:
        lo, hi = (float(part) for part in spec.split(","))
        await asyncio.sleep(random.uniform(lo, hi) / 1000)


async def write_invoice(envelope: EventEnvelope, session: AsyncSession) -> None:
    key = str(envelope.payload.get("key", ""))
    await session.execute(insert(invoices).values(event_id=envelope.event_id, key=key))
    await OutboxEventPublisher(session).publish(
        INVOICE, {"key": key}, aggregate_type="invoice", aggregate_id=envelope.aggregate_id
    )


async def write_receipt(envelope: EventEnvelope, session: AsyncSession) -> None:
    await session.execute(insert(receipts).values(event_id=envelope.event_id))


def _transactional(write):  # type: ignore[no-untyped-def]
    """The writes, then the pace, inside the dispatcher's transaction."""

    async def handler(envelope: EventEnvelope, session: AsyncSession) -> None:
        await write(envelope, session)
        await _pace()

    return handler


def _mutant(write, registry: EventRegistry):  # type: ignore[no-untyped-def]
    """The writes in a unit of work of their own (paced before it, so SQLite's write lock
    is held as briefly as a plain handler would): they commit before the record."""
    engine = create_engine(os.environ["OUTBOX_DATABASE_URL"])

    async def plain(envelope: EventEnvelope) -> None:
        await _pace()
        async with unit_of_work(engine, registry=registry, context=envelope.task_context()) as s:
            await write(envelope, s)

    return plain


def register(registry: EventRegistry) -> None:
    registry.register_event(ORDER, 1)
    registry.register_event(INVOICE, 1)
    mutant = os.environ.get(MUTANT_ENV) == "1"
    for event_type, write, key in (
        (ORDER, write_invoice, "chain.invoice"),
        (INVOICE, write_receipt, "chain.receipt"),
    ):
        if mutant:
            registry.register_handler(event_type, _mutant(write, registry), key=key)
        else:
            registry.register_handler(
                event_type, _transactional(write), key=key, transactional=True
            )
