"""The shop both recipes share: an order table, its event, and an installed app.

``register(registry)`` makes this module an installed app, so a dispatcher serves it:
``outbox-tui --dispatch --installed-app shop --app-dir docs/examples``.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlalchemy import Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import EventEnvelope, EventRegistry

# What the handler did, for the recipes' tests (a real handler calls a service).
DELIVERED: list[tuple[str, str, int]] = []


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "shop_orders"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    amount: Mapped[int] = mapped_column(Integer)


class OrderPlaced(BaseModel):
    """The event's payload (version 1): checked at publish and before the handler."""

    order_id: str
    amount: int = Field(gt=0)


def register(registry: EventRegistry) -> None:
    registry.register_event("shop.order_placed", 1, schema=OrderPlaced)

    @registry.handler("shop.order_placed", key="shop.confirm_order")
    async def confirm(envelope: EventEnvelope, order: OrderPlaced) -> None:
        DELIVERED.append((envelope.event_id, order.order_id, order.amount))


def shop_registry() -> EventRegistry:
    registry = EventRegistry()
    register(registry)
    return registry
