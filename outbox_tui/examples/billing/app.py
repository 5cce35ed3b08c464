"""Invoices for accepted orders, written exactly once.

``billing.invoice`` is a transactional handler of ``orders.placed``: its ``example_invoices``
row and the ``invoices.issued`` event it publishes commit in the dispatcher's transaction,
with the record that the handler ran. A redelivery (a retry of the order's warehouse call,
a crash, a replay) finds the record and invoices nothing twice; the follow-up carries its
cause (``causation_id``) and the chain's ``correlation_id``, which the console's detail shows.
"""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import Integer, Numeric, String
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import EventEnvelope, EventRegistry, EventSchemaSpec, OutboxEventPublisher
from outbox_tui.examples.orders.app import CREDIT_LIMIT


class Base(DeclarativeBase):
    pass


class Invoice(Base):
    __tablename__ = "example_invoices"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    order_id: Mapped[str] = mapped_column(String(36), index=True)
    tenant_id: Mapped[str] = mapped_column(String(128))
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2))


async def create_tables(engine: AsyncEngine) -> None:
    """Create the invoice table (the outbox tables come from create_schema)."""
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)


async def issue_invoice(envelope: EventEnvelope, session: AsyncSession) -> None:
    """Invoice an accepted order and announce it, in the dispatcher's transaction.

    No unique constraint keeps this to once: the handler record committed in the same
    transaction does. An order refused over the credit limit gets no invoice.
    """
    amount = int(envelope.payload["amount"])
    if amount > CREDIT_LIMIT:
        return
    order_id = str(envelope.payload["order_id"])
    session.add(Invoice(order_id=order_id, tenant_id=envelope.tenant_id, amount=Decimal(amount)))
    await OutboxEventPublisher(session).publish(
        "invoices.issued",
        {"order_id": order_id, "amount": amount},
        aggregate_type="invoice",
        aggregate_id=order_id,
    )


async def send_invoice(envelope: EventEnvelope) -> None:
    """Stand-in for mailing the invoice: recorded as a handler run."""
    return None


def register(registry: EventRegistry) -> None:
    """The plugin contract: the follow-up's type, and the handlers of both types."""
    registry.register_event(
        "invoices.issued", 1, EventSchemaSpec(required={"order_id": str, "amount": int})
    )
    registry.register_handler(
        "orders.placed", issue_invoice, key="billing.invoice", transactional=True
    )
    registry.register_handler("invoices.issued", send_invoice, key="billing.send")
