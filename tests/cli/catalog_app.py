"""An installed app for the catalog tests: a pydantic model with a nested one, an
EventSchemaSpec with ordering by payload, a type without schema, and a transactional
handler."""

from __future__ import annotations

from pydantic import BaseModel, Field

from engine import EventEnvelope, EventRegistry, EventSchemaSpec


class Line(BaseModel):
    sku: str
    quantity: int = Field(gt=0)


class OrderPlaced(BaseModel):
    order_id: str
    lines: list[Line]
    note: str | None = None


def register(registry: EventRegistry) -> None:
    registry.register_event("shop.order_placed", 1, schema=OrderPlaced)
    registry.register_event(
        "shop.order_placed",
        2,
        schema=EventSchemaSpec(required={"order_id": str, "total": float}, optional={"vip": bool}),
    )
    registry.set_ordering("shop.order_placed")
    registry.register_event("shop.invoice_sent", 1, EventSchemaSpec(required={"customer": str}))
    registry.set_ordering(
        "shop.invoice_sent", key=lambda p: f"customer:{p['customer']}", on_dead_letter="skip"
    )
    registry.register_event("shop.pinged", 1)

    @registry.handler("shop.order_placed", key="shop.reserve")
    async def reserve(envelope: EventEnvelope, order: OrderPlaced) -> None:
        return None

    @registry.handler("shop.order_placed", key="shop.book", transactional=True)
    async def book(envelope: EventEnvelope, session: object) -> None:
        return None
