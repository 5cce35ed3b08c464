"""Engine fixtures: a registry and helpers (``db`` and ``clock`` come from tests/conftest.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import EventRegistry, EventSchemaSpec, TaskContext
from engine.storage.schema import outbox_events

ORDER_PLACED = EventSchemaSpec(required={"order_id": str, "amount": int}, optional={"note": str})


@pytest.fixture
def registry() -> EventRegistry:
    reg = EventRegistry()
    reg.register_event("orders.placed", 1, ORDER_PLACED)
    reg.register_event("orders.cancelled", 1)
    return reg


CTX = TaskContext(tenant_id="acme", actor_id="user-1", request_id="req-1", trace_id="trace-abc")


def order_payload(order_id: str = "o-1", amount: int = 10, **extra: object) -> dict[str, object]:
    return {"order_id": order_id, "amount": amount, **extra}


async def rows(engine: AsyncEngine) -> list[dict[str, object]]:
    async with engine.connect() as conn:
        result = await conn.execute(select(outbox_events).order_by(outbox_events.c.id))
        return [dict(r) for r in result.mappings()]


async def row(engine: AsyncEngine, event_id: str) -> dict[str, object]:
    async with engine.connect() as conn:
        result = await conn.execute(select(outbox_events).where(outbox_events.c.id == event_id))
        return dict(result.mappings().one())
