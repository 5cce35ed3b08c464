"""Write outbox rows in a synchronous transaction: Flask, sync routes, tasks, scripts.

The same rows and checks as the async publisher (``outbox_row``: type, version, schema,
tenant, aggregate, attempts, ordering key) through the caller's ``Session`` or
``Connection``, on ``sqlite``, ``postgresql+psycopg`` or ``postgresql+psycopg2``; the same
table contract, so the async dispatcher delivers them like any other row. The INSERT goes
through SQLAlchemy's execution: a sync producer does not share the async path's driver
calls.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from sqlalchemy.engine import Connection
from sqlalchemy.exc import StatementError
from sqlalchemy.orm import Session

from engine.clock import Clock
from engine.clock import utc_now as _utc_now
from engine.context import current_task_context
from engine.errors import EventValidationError, OutboxTransactionError
from engine.tracing.publishing import publish_spans
from engine.writing.publisher import (
    _INSERT,
    SESSION_CONTEXT,
    SESSION_EVENTS_WRITTEN,
    SESSION_REGISTRY,
    OutboxEvent,
    _columns_of,
    outbox_row,
)
from engine.writing.registry import EventRegistry

SYNC_DIALECTS = ("sqlite", "postgresql")


class SyncOutboxEventPublisher:
    """Adds events to the outbox through a sync ``Session`` or ``Connection``.

    Like ``OutboxEventPublisher`` it never opens a connection of its own and refuses to
    write outside an active transaction. The registry and task context come from
    ``sync_unit_of_work`` when the session is one of its, or are passed here.
    """

    def __init__(
        self,
        bind: Session | Connection,
        registry: EventRegistry | None = None,
        *,
        clock: Clock = _utc_now,
    ) -> None:
        # A Connection's info belongs to its pooled DB-API connection and outlives this
        # transaction: only a Session's is read (and marked).
        if registry is None and isinstance(bind, Session):
            registry = bind.info.get(SESSION_REGISTRY)
        if registry is None:
            raise OutboxTransactionError(
                "SyncOutboxEventPublisher needs an EventRegistry (pass one, or open the "
                "sync_unit_of_work with registry=...)"
            )
        self._bind = bind
        self._registry: EventRegistry = registry
        self._clock = clock

    def publish(
        self,
        event_type: str,
        payload: Mapping[str, Any] | BaseModel,
        *,
        aggregate_type: str,
        aggregate_id: str,
        event_version: int = 1,
        tenant_id: str | None = None,
        max_attempts: int | None = None,
        ordering_key: str | None = None,
    ) -> str:
        """Validate and add one event; returns its id (see ``OutboxEventPublisher.publish``)."""
        event = OutboxEvent(
            event_type,
            payload,
            aggregate_type,
            aggregate_id,
            event_version,
            tenant_id,
            max_attempts,
            ordering_key,
        )
        return self.publish_many([event])[0]

    def publish_many(self, events: Sequence[OutboxEvent]) -> list[str]:
        """Validate and add several events; returns their ids, in write order."""
        bind = self._bind
        if not bind.in_transaction():
            raise OutboxTransactionError(
                "outbox events must be published inside an active transaction: "
                "use `with sync_unit_of_work(...) as session` (or `with engine.begin()`)"
            )
        dialect = (bind.get_bind(clause=_INSERT) if isinstance(bind, Session) else bind).dialect
        if dialect.name not in SYNC_DIALECTS:
            raise OutboxTransactionError(
                f"the outbox cannot be written through a {dialect.name} connection "
                "(SQLite and PostgreSQL only)"
            )
        session = bind if isinstance(bind, Session) else None
        context = (session.info.get(SESSION_CONTEXT) if session else None) or (
            current_task_context()
        )
        rows = [outbox_row(self._registry, self._clock, event, context) for event in events]
        with publish_spans(rows):  # the trace context each row stores (engine.tracing)
            _insert(bind, rows)
        if rows and session is not None:
            session.info[SESSION_EVENTS_WRITTEN] = True
        return [row["id"] for row in rows]


def _insert(bind: Session | Connection, rows: list[dict[str, Any]]) -> None:
    """One executemany per run of rows with the same columns, in write order (see
    OutboxEventPublisher._insert_through_session); a payload that is not JSON is an
    ``EventValidationError``."""
    try:
        for _columns, run in itertools.groupby(rows, key=_columns_of):
            same = list(run)
            bind.execute(_INSERT, same[0] if len(same) == 1 else same)
    except StatementError as exc:
        if isinstance(exc.orig, TypeError | ValueError):
            message = f"payload is not JSON-serialisable: {exc.orig}"
            raise EventValidationError(message) from None
        raise
    except (TypeError, ValueError) as exc:
        # psycopg serialises jsonb itself, at execute: its json error is not wrapped.
        _raise_unless_serialisable(rows, exc)
        raise


def _raise_unless_serialisable(rows: list[dict[str, Any]], exc: Exception) -> None:
    """An ``EventValidationError`` if a row's payload is not JSON, else nothing."""
    for row in rows:
        try:
            json.dumps(row["payload"])
        except (TypeError, ValueError):
            raise EventValidationError(f"payload is not JSON-serialisable: {exc}") from None
