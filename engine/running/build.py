"""An ``OutboxDispatcher`` built from the settings a run loop runs with."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from engine.clock import Clock, utc_now
from engine.dispatch import (
    DispatchObserver,
    ExternalPublisher,
    OutboxDispatcher,
    default_dispatcher_id,
)
from engine.dispatch.backoff import BackoffPolicy
from engine.handlers.idempotency import IdempotencyStore
from engine.running.locks import lock_provider_for
from engine.running.metrics import OutboxMetrics
from engine.settings import DispatcherSettings
from engine.writing.registry import EventRegistry


def build_dispatcher(
    engine: AsyncEngine,
    registry: EventRegistry,
    settings: DispatcherSettings,
    *,
    dispatcher_id: str | None = None,
    external_publisher: ExternalPublisher | None = None,
    metrics: OutboxMetrics | None = None,
    clock: Clock = utc_now,
    idempotency_store: IdempotencyStore | None = None,
    prefetch: bool = False,
) -> OutboxDispatcher:
    """An ``OutboxDispatcher`` configured from ``settings``.

    Wires batch size, lease, backoff, the metrics observer and, with
    ``use_lock``, the lock provider of the engine's dialect (advisory lock on
    PostgreSQL, lease row on SQLite) held for ``lease_seconds`` at most.
    """
    dispatcher_id = dispatcher_id or default_dispatcher_id()
    lock = None
    if settings.use_lock:
        lock = lock_provider_for(
            engine, holder=dispatcher_id, lease_seconds=settings.lease_seconds, clock=clock
        )
    observers: list[DispatchObserver] = [metrics] if metrics is not None else []
    if metrics is not None:  # bounded label sets: the registry's types, nothing else
        metrics.label_types(event_type for event_type, _version in registry.event_types())
    return OutboxDispatcher(
        engine,
        registry,
        dispatcher_id=dispatcher_id,
        batch_size=settings.batch_size,
        lease_seconds=settings.lease_seconds,
        max_attempts=settings.max_attempts,
        max_concurrency=settings.max_concurrency,
        handler_timeout_seconds=settings.handler_timeout_seconds,
        backoff=BackoffPolicy(
            kind=settings.backoff_kind,
            base_seconds=settings.backoff_base_seconds,
            max_seconds=settings.backoff_max_seconds,
            jitter=settings.backoff_jitter,
        ),
        idempotency_store=idempotency_store,
        external_publisher=external_publisher,
        lock_provider=lock,
        observers=observers,
        clock=clock,
        prefetch=prefetch,
        overlap_rounds=prefetch,
    )
