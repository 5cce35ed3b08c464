"""Rows written straight into outbox_events, for read-side tests that need exact statuses,
errors and times (the dispatcher writes the same columns; see test_dispatch.py for that)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.clock import uuid7
from engine.storage.schema import outbox_events


def event_row(
    *,
    status: str = "pending",
    event_type: str = "orders.placed",
    tenant_id: str = "acme",
    created_at: datetime,
    last_error: str | None = None,
    dead_letter_reason: str | None = None,
    last_replayed_at: datetime | None = None,
    event_id: str | None = None,
) -> dict[str, Any]:
    return {
        "id": event_id or uuid7(),
        "tenant_id": tenant_id,
        "event_type": event_type,
        "event_version": 1,
        "aggregate_type": "order",
        "aggregate_id": "o-1",
        "payload": {"order_id": "o-1", "amount": 1},
        "status": status,
        "attempt_count": 0 if status == "pending" else 1,
        "last_error": last_error,
        "dead_letter_reason": dead_letter_reason,
        "last_replayed_at": last_replayed_at,
        "replay_count": 1 if last_replayed_at else 0,
        "created_at": created_at,
    }


async def insert_events(db: AsyncEngine, *events: dict[str, Any]) -> list[str]:
    """Insert ``event_row(...)`` dicts in order; their ids, in the same order."""
    async with db.begin() as conn:
        await conn.execute(insert(outbox_events), list(events))
    return [e["id"] for e in events]
