"""outbox engine: a transactional outbox for SQLAlchemy on SQLite and PostgreSQL.

Business rows and outbox events commit in one transaction; a dispatcher claims
due events under a lease, hands them to idempotent handlers (or a broker
relay) and records each outcome behind a fencing token.
"""

from engine.backoff import BackoffPolicy
from engine.context import TaskContext
from engine.database import create_engine, create_schema, mask_url
from engine.dispatcher import DispatchResult, OutboxDispatcher
from engine.domain import AggregateRoot
from engine.envelope import EventEnvelope
from engine.errors import (
    EventHandlerPermanentError,
    EventValidationError,
    OutboxError,
    OutboxTransactionError,
    ReplayError,
)
from engine.idempotency import IdempotencyStore
from engine.publisher import OutboxEventPublisher
from engine.registry import EventRegistry, EventSchemaSpec, Ordering
from engine.replay import replay_dead_letter, skip_dead_letter
from engine.schema import metadata
from engine.side_effects import run_event_side_effect
from engine.uow import unit_of_work

__all__ = [
    "AggregateRoot",
    "BackoffPolicy",
    "DispatchResult",
    "EventEnvelope",
    "EventHandlerPermanentError",
    "EventRegistry",
    "EventSchemaSpec",
    "EventValidationError",
    "IdempotencyStore",
    "Ordering",
    "OutboxDispatcher",
    "OutboxError",
    "OutboxEventPublisher",
    "OutboxTransactionError",
    "ReplayError",
    "TaskContext",
    "create_engine",
    "create_schema",
    "mask_url",
    "metadata",
    "replay_dead_letter",
    "run_event_side_effect",
    "skip_dead_letter",
    "unit_of_work",
]
