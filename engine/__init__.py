"""outbox engine: a transactional outbox for SQLAlchemy on SQLite and PostgreSQL.

Business rows and outbox events commit in one transaction; a dispatcher claims
due events under a lease, hands them to idempotent handlers (or a broker
relay) and records each outcome behind a fencing token.

This module is the public API: producing (``unit_of_work``, publisher,
registry), running (``run_dispatcher``, ``load_settings``), operating
(``OutboxInsights`` and its types, error groups, pauses, replay and skip) and
every error class, all under ``OutboxError``.
"""

from engine.context import TaskContext, current_task_context
from engine.dispatch import DispatchResult, OutboxDispatcher
from engine.dispatch.backoff import BackoffPolicy
from engine.errors import (
    BrokerUnavailableError,
    ConfigurationError,
    DatabaseAuthenticationError,
    DatabaseUnavailableError,
    DatabaseUrlError,
    DomainEventError,
    EventHandlerPermanentError,
    EventNotFoundError,
    EventRegistrationError,
    EventValidationError,
    InstalledAppError,
    NothingToDeliverError,
    OutboxError,
    OutboxTransactionError,
    PauseError,
    ReplayError,
    SchemaMissingError,
    SchemaOutdatedError,
    StorageError,
    TenantMismatchError,
    UnknownEventTypeError,
)
from engine.handlers.idempotency import IdempotencyStore
from engine.handlers.side_effects import run_event_side_effect
from engine.operating.dispatch_health import BlockedKey, HeartbeatView, UnservedType
from engine.operating.error_groups import ErrorGroup, ErrorGroups
from engine.operating.insights import (
    EventDetail,
    EventFilter,
    EventPage,
    EventSummary,
    MatchSummary,
    OutboxInsights,
    OverviewSnapshot,
    TypeCounts,
)
from engine.operating.pauses import Pause, PausedBacklog
from engine.operating.replay import ReplayResult, SkipResult, replay_dead_letter, skip_dead_letter
from engine.running.build import build_dispatcher
from engine.running.run_loop import run_dispatcher
from engine.running.summary import RunSummary
from engine.settings import DispatcherSettings, OutboxSettings, load_settings
from engine.storage.database import create_engine, create_schema
from engine.storage.schema import metadata
from engine.storage.secrets import mask_url
from engine.storage.sync_database import create_sync_engine
from engine.writing.domain import AggregateRoot
from engine.writing.envelope import EventEnvelope
from engine.writing.publisher import OutboxEvent, OutboxEventPublisher
from engine.writing.registry import EventRegistry, Ordering
from engine.writing.schema_spec import EventSchemaSpec
from engine.writing.sync_publisher import SyncOutboxEventPublisher
from engine.writing.sync_uow import sync_unit_of_work
from engine.writing.uow import unit_of_work

__all__ = [
    "AggregateRoot",
    "BackoffPolicy",
    "BlockedKey",
    "BrokerUnavailableError",
    "ConfigurationError",
    "DatabaseAuthenticationError",
    "DatabaseUnavailableError",
    "DatabaseUrlError",
    "DispatchResult",
    "DispatcherSettings",
    "DomainEventError",
    "ErrorGroup",
    "ErrorGroups",
    "EventDetail",
    "EventEnvelope",
    "EventFilter",
    "EventHandlerPermanentError",
    "EventNotFoundError",
    "EventPage",
    "EventRegistrationError",
    "EventRegistry",
    "EventSchemaSpec",
    "EventSummary",
    "EventValidationError",
    "HeartbeatView",
    "IdempotencyStore",
    "InstalledAppError",
    "MatchSummary",
    "NothingToDeliverError",
    "Ordering",
    "OutboxDispatcher",
    "OutboxError",
    "OutboxEvent",
    "OutboxEventPublisher",
    "OutboxInsights",
    "OutboxSettings",
    "OutboxTransactionError",
    "OverviewSnapshot",
    "Pause",
    "PauseError",
    "PausedBacklog",
    "ReplayError",
    "ReplayResult",
    "RunSummary",
    "SchemaMissingError",
    "SchemaOutdatedError",
    "SkipResult",
    "StorageError",
    "SyncOutboxEventPublisher",
    "TaskContext",
    "TenantMismatchError",
    "TypeCounts",
    "UnknownEventTypeError",
    "UnservedType",
    "build_dispatcher",
    "create_engine",
    "create_schema",
    "create_sync_engine",
    "current_task_context",
    "load_settings",
    "mask_url",
    "metadata",
    "replay_dead_letter",
    "run_dispatcher",
    "run_event_side_effect",
    "skip_dead_letter",
    "sync_unit_of_work",
    "unit_of_work",
]
