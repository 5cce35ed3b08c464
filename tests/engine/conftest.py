"""Engine fixtures: a real database with the outbox schema, a registry, a controllable clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import EventRegistry, EventSchemaSpec, TaskContext, create_engine, create_schema
from engine.schema import outbox_events


class FakeClock:
    """A clock tests move by hand, so leases and backoff are exact."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(database_url)
    await create_schema(engine)
    try:
        yield engine
    finally:
        await engine.dispose()


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
