"""Write outbox rows inside the caller's transaction: the heart of the outbox.

On PostgreSQL the rows go straight to the session's driver connection as one prepared
INSERT (asyncpg's statement cache, or psycopg's ``prepare=True``, keeps it prepared per
connection), in the session's transaction: the publish is on every business
transaction's path, and SQLAlchemy's statement execution was a large share of the client
CPU it adds to a unit of work (see decisions 0011 and 0035). SQLite keeps the ordinary
``session.execute``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic import BaseModel
from sqlalchemy import insert
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import StatementError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from engine.clock import Clock, as_utc, uuid7
from engine.clock import utc_now as _utc_now
from engine.context import TaskContext, _handler_invocation, current_task_context
from engine.errors import EventValidationError, OutboxTransactionError
from engine.storage import psycopg_paths
from engine.storage.drivers import as_dbapi_error, is_asyncpg, is_psycopg
from engine.storage.schema import outbox_events
from engine.tracing.publishing import publish_spans
from engine.writing.models import payload_of
from engine.writing.registry import EventRegistry, check_ordering_key

_INSERT = insert(outbox_events)
_BIND = {"clause": _INSERT}  # the bind session.execute(_INSERT) would pick
SESSION_CONTEXT = "outbox_task_context"
SESSION_REGISTRY = "outbox_registry"
# Set once the session wrote outbox rows; commit hooks (engine.running.wakeup) read and clear it.
SESSION_EVENTS_WRITTEN = "outbox_events_written"


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """An event to publish, before it has an id."""

    event_type: str
    payload: Mapping[str, Any] | BaseModel  # a model instance is dumped to JSON types
    aggregate_type: str
    aggregate_id: str
    event_version: int = 1
    tenant_id: str | None = None
    max_attempts: int | None = None
    # Overrides the key the event type's ordering gives (engine.writing.registry.Ordering).
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
        registry = registry or session.info.get(SESSION_REGISTRY)
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
        payload: Mapping[str, Any] | BaseModel,
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
        context = self._session.info.get(SESSION_CONTEXT) or current_task_context()
        rows = [self._row(event, context) for event in events]
        if not rows:
            return []
        with publish_spans(rows):  # the trace context each row stores (engine.tracing)
            dialect = self._session.sync_session.get_bind(clause=_INSERT).dialect
            if dialect.name != "postgresql" or not await _insert_on_driver(
                self._session, dialect, rows
            ):
                await self._insert_through_session(rows)
        self._session.info[SESSION_EVENTS_WRITTEN] = True
        return [row["id"] for row in rows]

    async def _insert_through_session(self, rows: list[dict[str, Any]]) -> None:
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

    def _row(self, event: OutboxEvent, context: TaskContext | None) -> dict[str, Any]:
        return outbox_row(self._registry, self._clock, event, context)


def outbox_row(
    registry: EventRegistry, clock: Clock, event: OutboxEvent, context: TaskContext | None
) -> dict[str, Any]:
    """The ``outbox_events`` row of ``event``, checked as every publisher checks it (type,
    version, schema, tenant, aggregate, attempts, ordering key); shared by the async and
    the sync publisher (engine.writing.sync_publisher)."""
    payload = payload_of(event.payload)
    if context is not None:
        for name, value in context.envelope_fields().items():
            payload.setdefault(name, value)
    tenant_id = event.tenant_id or (context.tenant_id if context else None)
    if tenant_id is None:
        raise EventValidationError(
            f"{event.event_type}: the event's tenant_id is required "
            "(pass tenant_id=... or open the unit of work with a TaskContext)"
        )
    registry.validate_event(event.event_type, event.event_version, payload, tenant_id)
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
        "created_at": clock(),
    }
    if max_attempts is not None:
        row["max_attempts"] = max_attempts
    if event.ordering_key is not None:
        row["ordering_key"] = check_ordering_key(event.event_type, event.ordering_key)
    else:
        row["ordering_key"] = registry.ordering_key_for(
            event.event_type, event.aggregate_type, str(event.aggregate_id), payload
        )
    invocation = _handler_invocation.get()
    if invocation is not None:  # published by a handler: the next link of its chain
        cause = invocation[0]
        row["causation_id"] = cause.event_id
        row["correlation_id"] = cause.correlation_id or cause.event_id
    return row


def _columns_of(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(row)


@cache
def _insert_sql(columns: tuple[str, ...], psycopg: bool = False) -> str:
    """The PostgreSQL INSERT of one column set, with asyncpg's ``$n`` parameters (or
    psycopg's ``%s``)."""
    names = ", ".join(columns)
    if psycopg:
        params = ", ".join("%s" for _ in columns)
    else:
        params = ", ".join(f"${n}" for n in range(1, len(columns) + 1))
    return f"INSERT INTO {outbox_events.name} ({names}) VALUES ({params})"


def _driver_values(row: dict[str, Any], serialize: Any, wrap: Any = None) -> tuple[Any, ...]:
    """The row's values in its column order, as the columns' types would bind them
    (``wrap``: how the driver takes the payload's JSON text, when not as text)."""
    values = list(row.values())
    for n, column in enumerate(row):
        if column == "payload":
            values[n] = serialize(values[n])
            if wrap is not None:
                values[n] = wrap(values[n])
        elif column == "created_at":
            values[n] = as_utc(values[n])
    return tuple(values)


def _flushed_driver_connection(session: Session) -> Any:
    """Autoflush, then the session's asyncpg connection for the outbox table (runs in the
    session's greenlet); None when a schema_translate_map applies, which only SQLAlchemy's
    compiler renders.

    The flush comes first, as ``session.execute`` does it: a unit of work that locks its
    aggregate by writing it takes the lock before its event gets a ``seq``.
    """
    if session.autoflush:
        session.flush()
    connection = session.connection(bind_arguments=_BIND)
    if connection.get_execution_options().get("schema_translate_map"):
        return None
    return connection.connection.driver_connection


async def _insert_on_driver(
    session: AsyncSession, dialect: Dialect, rows: list[dict[str, Any]]
) -> bool:
    """Insert ``rows`` on the session's asyncpg or psycopg connection; False when it is
    not in a transaction yet (the caller's ``session.execute`` then begins one as usual),
    the table name needs SQLAlchemy's schema translation, or the driver is another.

    One greenlet hop (autoflush and the connection), then one round trip per run of rows
    with the same columns (``execute`` for one row, a pipelined ``executemany`` for
    several), in write order. The statement bypasses SQLAlchemy's execution: connection
    events (``before_cursor_execute``), echo/logging and ``do_orm_execute`` hooks do not
    see it. A driver error is raised as SQLAlchemy's ``DBAPIError`` subclass, as
    ``session.execute`` raises it, and the transaction rolls back with the unit of work.
    """
    psycopg = is_psycopg(dialect)
    if not psycopg and not is_asyncpg(dialect):
        return False
    serialize = getattr(dialect, "_json_serializer", None) or json.dumps
    wrap = psycopg_paths.jsonb_text() if psycopg else None
    try:
        batches = [
            (_insert_sql(columns, psycopg), [_driver_values(row, serialize, wrap) for row in run])
            for columns, run in itertools.groupby(rows, key=_columns_of)
        ]
    except (TypeError, ValueError) as exc:
        raise EventValidationError(f"payload is not JSON-serialisable: {exc}") from None
    driver = await session.run_sync(_flushed_driver_connection)
    if driver is None:
        return False
    if psycopg:
        if driver.autocommit:
            return False
        await psycopg_paths.insert_rows(driver, dialect, batches)
        return True
    if not driver.is_in_transaction():
        return False
    for sql, values in batches:
        try:
            if len(values) == 1:
                await driver.execute(sql, *values[0])
            else:
                await driver.executemany(sql, values)
        except Exception as exc:
            raise as_dbapi_error(dialect, sql, exc) from exc
    return True
