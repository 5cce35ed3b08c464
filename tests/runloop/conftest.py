"""Run-loop fixtures: a real database with the outbox schema, a registry, helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import (
    EventRegistry,
    EventSchemaSpec,
    OutboxEventPublisher,
    TaskContext,
    unit_of_work,
)
from engine.settings import DispatcherSettings
from engine.storage.schema import outbox_events, process_heartbeats
from engine.writing.publisher import OutboxEvent

CTX = TaskContext(tenant_id="acme", actor_id="user-1", request_id="req-1")


@pytest.fixture
def registry() -> EventRegistry:
    reg = EventRegistry()
    reg.register_event("orders.placed", 1, EventSchemaSpec(required={"order_id": str}))
    return reg


def fast(**overrides: object) -> DispatcherSettings:
    """Settings for tests: short sleeps, no retention unless asked."""
    values: dict[str, object] = {
        "idle_sleep_seconds": 0.01,
        "retention_seconds": None,
        "storage_retry_initial_seconds": 0.01,
        "storage_retry_max_seconds": 0.05,
        "heartbeat_min_interval_seconds": 0,
    }
    values.update(overrides)
    return DispatcherSettings.model_validate(values)


async def publish(
    engine: AsyncEngine, registry: EventRegistry, count: int = 1, prefix: str = "o", **kw: Any
) -> list[str]:
    drafts = [
        OutboxEvent("orders.placed", {"order_id": f"{prefix}-{i}"}, "order", f"{prefix}-{i}", **kw)
        for i in range(count)
    ]
    async with unit_of_work(engine, registry=registry, context=CTX) as session:
        return await OutboxEventPublisher(session).publish_many(drafts)


async def statuses(engine: AsyncEngine) -> dict[str, str]:
    async with engine.connect() as conn:
        result = await conn.execute(select(outbox_events.c.id, outbox_events.c.status))
        return {r[0]: r[1] for r in result}


async def heartbeat_row(engine: AsyncEngine, instance_id: str) -> dict[str, object] | None:
    async with engine.connect() as conn:
        result = await conn.execute(
            select(process_heartbeats).where(process_heartbeats.c.instance_id == instance_id)
        )
        found = result.mappings().first()
        return None if found is None else dict(found)


async def eventually(
    condition: Callable[[], bool],
    *,
    within: float = 30.0,
    interval: float = 0.01,
) -> None:
    """Wait until ``condition()`` holds; fail the test after ``within`` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"condition not met within {within}s")
        await asyncio.sleep(interval)
