"""The outbox tables as the first release (0.1) made them, before "Delivery v2".

Written out by hand (no ordering_key, seq or skipped_at; no replay-log action; the old
``ix_outbox_events_active`` claim index) so ``init-db`` can be tested upgrading a database
an earlier version created, on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import (
    CheckConstraint,
    Column,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
)

from engine import create_engine
from engine.storage.schema import (
    Json,
    UtcDateTime,
    handler_runs,
    locks,
    process_heartbeats,
    side_effects,
)

OLD = MetaData()

old_events = Table(
    "outbox_events",
    OLD,
    Column("id", String(36), primary_key=True),
    Column("tenant_id", String(128), nullable=False),
    Column("event_type", String(200), nullable=False),
    Column("event_version", Integer, nullable=False),
    Column("aggregate_type", String(200), nullable=False),
    Column("aggregate_id", String(200), nullable=False),
    Column("payload", Json, nullable=False),
    Column("status", String(16), nullable=False, server_default="pending"),
    Column("claim_version", Integer, nullable=False, server_default="0"),
    Column("attempt_count", Integer, nullable=False, server_default="0"),
    Column("max_attempts", Integer, nullable=False, server_default="10"),
    Column("next_retry_at", UtcDateTime(), nullable=True),
    Column("locked_by", String(200), nullable=True),
    Column("locked_until", UtcDateTime(), nullable=True),
    Column("last_error", Text, nullable=True),
    Column("published_at", UtcDateTime(), nullable=True),
    Column("dead_letter_reason", Text, nullable=True),
    Column("replay_count", Integer, nullable=False, server_default="0"),
    Column("last_replayed_at", UtcDateTime(), nullable=True),
    Column("created_at", UtcDateTime(), nullable=False, server_default=text("CURRENT_TIMESTAMP")),
    CheckConstraint(
        "status IN ('pending', 'publishing', 'published', 'failed', 'dead_letter')",
        name="ck_outbox_events_status",
    ),
)
_ACTIVE = text("status IN ('pending', 'publishing', 'failed')")
Index("ix_outbox_events_active", old_events.c.id, postgresql_where=_ACTIVE, sqlite_where=_ACTIVE)
_PUBLISHING, _PUBLISHED = text("status = 'publishing'"), text("status = 'published'")
Index(
    "ix_outbox_events_lease",
    old_events.c.locked_until,
    postgresql_where=_PUBLISHING,
    sqlite_where=_PUBLISHING,
)
Index("ix_outbox_events_status_id", old_events.c.status, old_events.c.id)
Index(
    "ix_outbox_events_published_at",
    old_events.c.published_at,
    postgresql_where=_PUBLISHED,
    sqlite_where=_PUBLISHED,
)
Index("ix_outbox_events_aggregate_id", old_events.c.aggregate_id)

old_replay_log = Table(
    "outbox_replay_log",
    OLD,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_id", String(36), nullable=False),
    Column("operator", String(200), nullable=False),
    Column("reason", Text, nullable=True),
    Column("cleared_dead_letter_reason", Text, nullable=True),
    Column("cleared_last_error", Text, nullable=True),
    Column("previous_attempt_count", Integer, nullable=False),
    Column("replayed_at", UtcDateTime(), nullable=False),
)
# The tables this release did not change.
for unchanged in (process_heartbeats, handler_runs, side_effects, locks):
    unchanged.to_metadata(OLD)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _event(index: int, status: str) -> dict[str, object]:
    order = f"o-{index}"
    return {
        "id": f"0190aaaa-0000-7000-8000-{index:012d}",
        "tenant_id": "acme",
        "event_type": "orders.placed",
        "event_version": 1,
        "aggregate_type": "order",
        "aggregate_id": order,
        "payload": {
            "order_id": order,
            "customer": "ada",
            "amount": 42,
            "tenant_id": "acme",
            "actor_id": "u-1",
            "request_id": f"r-{index}",
        },
        "status": status,
        "dead_letter_reason": "permanent: refused" if status == "dead_letter" else None,
        "published_at": T0 + timedelta(seconds=index) if status == "published" else None,
        "created_at": T0 + timedelta(seconds=index),
    }


OLD_STATUSES = ("published", "published", "dead_letter", "pending", "pending")


async def create_old_schema(url: str) -> None:
    """The 0.1 tables with a few rows: two published, one dead letter, two pending."""
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(OLD.create_all)
            await conn.execute(
                old_events.insert(), [_event(i, s) for i, s in enumerate(OLD_STATUSES)]
            )
    finally:
        await engine.dispose()
