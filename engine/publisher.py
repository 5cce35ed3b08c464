"""Write outbox rows inside the caller's transaction: the heart of the outbox."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert
from sqlalchemy.exc import StatementError
from sqlalchemy.ext.asyncio import AsyncSession

from engine.clock import Clock, uuid7
from engine.clock import utc_now as _utc_now
from engine.context import TaskContext, current_task_context
from engine.errors import EventValidationError, OutboxTransactionError
from engine.registry import EventRegistry, check_ordering_key
from engine.schema import outbox_events

_INSERT = insert(outbox_events)
_SESSION_CONTEXT = "outbox_task_context"
_SESSION_REGISTRY = "outbox_registry"
# Set once the session wrote outbox rows; commit hooks (engine.wakeup) read and clear it.
SESSION_EVENTS_WRITTEN = "outbox_events_written"


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """An event to publish, before it has an id."""

    event_type: str
    payload: Mapping[str, Any]
    aggregate_type: str
    aggregate_id: str
    event_version: int = 1
    tenant_id: str | None = None
    max_attempts: int | None = None
    # Overrides the key the event type's ordering gives (engine.registry.Ordering).
    ordering_key: str | None = None


class OutboxEventPublisher:
    """Adds events to the outbox through the unit of work's session.

    It never opens a connection of its own: the rows commit or roll back with
    the business writes of the same transaction.
    """

    def __init__(
        self,
        session: AsyncSession,
        registry: EventRegistry | None = None,
        *,
        clock: Clock = _utc_now,
    ) -> None:
        registry = registry or session.info.get(_SESSION_REGISTRY)
        if registry is None:
            raise OutboxTransactionError(
                "OutboxEventPublisher needs an EventRegistry (pass one, or open the "
                "unit_of_work with registry=...)"
            )
        self._session = session
        self._registry: EventRegistry = registry
        self._clock = clock

    async def publish(
        self,
        event_type: str,
        payload: Mapping[str, Any],
        *,
        aggregate_type: str,
        aggregate_id: str,
        event_version: int = 1,
        tenant_id: str | None = None,
        max_attempts: int | None = None,
        ordering_key: str | None = None,
    ) -> str:
        """Validate and add one event; returns its id.

        ``ordering_key`` puts the event in order behind the earlier events of that
        key (default: the key the event type's ordering gives, or none).
        """
        ids = await self.publish_many(
            [
                OutboxEvent(
                    event_type,
                    payload,
                    aggregate_type,
                    aggregate_id,
                    event_version,
                    tenant_id,
                    max_attempts,
                    ordering_key,
                )
            ]
        )
        return ids[0]

    async def publish_many(self, events: Sequence[OutboxEvent]) -> list[str]:
        """Validate and add several events in one statement; returns their ids."""
        if not self._session.in_transaction():
            raise OutboxTransactionError(
                "outbox events must be published inside an active transaction: "
                "use `async with unit_of_work(...) as session`"
            )
        context = self._session.info.get(_SESSION_CONTEXT) or current_task_context()
        rows = [self._row(event, context) for event in events]
        if not rows:
            return []
        try:
            # One executemany per run of rows with the same columns, in write order (an
            # executemany takes its columns from its first row: a max_attempts set on a
            # later row alone would be dropped, and seq must follow the order given).
            for _columns, run in itertools.groupby(rows, key=_columns_of):
                same = list(run)
                await self._session.execute(_INSERT, same[0] if len(same) == 1 else same)
        except StatementError as exc:
            if isinstance(exc.orig, TypeError | ValueError):
                raise EventValidationError(
                    f"payload is not JSON-serialisable: {exc.orig}"
                ) from None
            raise
        self._session.info[SESSION_EVENTS_WRITTEN] = True
        return [row["id"] for row in rows]

    def _row(self, event: OutboxEvent, context: TaskContext | None) -> dict[str, Any]:
        payload = dict(event.payload)
        if context is not None:
            for name, value in context.envelope_fields().items():
                payload.setdefault(name, value)
        tenant_id = event.tenant_id or (context.tenant_id if context else None)
        if tenant_id is None:
            raise EventValidationError(
                f"{event.event_type}: the event's tenant_id is required "
                "(pass tenant_id=... or open the unit of work with a TaskContext)"
            )
        self._registry.validate_event(event.event_type, event.event_version, payload, tenant_id)
        if not event.aggregate_type or not str(event.aggregate_id):
            raise EventValidationError(
                f"{event.event_type}: aggregate_type and aggregate_id are required"
            )
        max_attempts = event.max_attempts
        if max_attempts is not None and max_attempts < 1:
            raise EventValidationError(f"{event.event_type}: max_attempts must be >= 1")
        row: dict[str, Any] = {
            "id": uuid7(),
            "tenant_id": tenant_id,
            "event_type": event.event_type,
            "event_version": event.event_version,
            "aggregate_type": event.aggregate_type,
            "aggregate_id": str(event.aggregate_id),
            "payload": payload,
            "created_at": self._clock(),
        }
        if max_attempts is not None:
            row["max_attempts"] = max_attempts
        if event.ordering_key is not None:
            row["ordering_key"] = check_ordering_key(event.event_type, event.ordering_key)
        else:
            row["ordering_key"] = self._registry.ordering_key_for(
                event.event_type, event.aggregate_type, str(event.aggregate_id), payload
            )
        return row


def _columns_of(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(row)
