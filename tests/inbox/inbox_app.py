"""The receiving service of the consume command's tests: it registers what it receives."""

from __future__ import annotations

from engine import EventRegistry, EventSchemaSpec

TYPE = "orders.placed"


def register(registry: EventRegistry) -> None:
    registry.register_event(TYPE, 1, EventSchemaSpec(required={"order_id": str}))
