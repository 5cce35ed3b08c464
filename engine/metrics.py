"""Prometheus metrics for a dispatcher: counters per round, gauges from the database.

Counters are fed by ``observe_round`` (the ``DispatchObserver`` protocol), so
they count what this process did. Gauges describe the whole outbox and come
from one indexed query in ``refresh_gauges``, which the run loop calls at most
every ``housekeeping_seconds`` (not every round). Each ``OutboxMetrics`` owns
its ``CollectorRegistry`` unless given one, so several instances (tests, two
dispatchers in one console) never collide in prometheus-client's global one.
"""

from __future__ import annotations

from datetime import datetime
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.clock import Clock, as_utc, utc_now
from engine.database import read_only_engine
from engine.dispatcher import DispatchResult
from engine.schema import DEAD_LETTER, FAILED, PENDING, PUBLISHING, outbox_events

t = outbox_events


class OutboxMetrics:
    """Counters and gauges of one dispatcher process."""

    def __init__(self, registry: CollectorRegistry | None = None, *, clock: Clock = utc_now):
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clock = clock
        r = self.registry
        self.claimed = Counter(
            "outbox_events_claimed", "Events claimed by this process.", registry=r
        )
        self.published = Counter(
            "outbox_events_published", "Events published by this process.", registry=r
        )
        self.failed = Counter(
            "outbox_events_failed", "Failed attempts scheduled for a retry.", registry=r
        )
        self.dead_lettered = Counter(
            "outbox_events_dead_lettered", "Events moved to the dead letter.", registry=r
        )
        self.lost_leases = Counter(
            "outbox_events_lost_leases",
            "Completions refused because the lease had expired or been taken over.",
            registry=r,
        )
        self.purged = Counter(
            "outbox_events_purged", "Published events deleted by retention.", registry=r
        )
        self.storage_errors = Counter(
            "outbox_dispatcher_storage_errors",
            "Rounds that failed because the database was unreachable or refused a write.",
            registry=r,
        )
        self.pending = Gauge(
            "outbox_events_pending", "Events waiting for their first attempt.", registry=r
        )
        self.retrying = Gauge(
            "outbox_events_retrying", "Failed events waiting for their next attempt.", registry=r
        )
        self.publishing = Gauge(
            "outbox_events_publishing", "Events claimed under a lease right now.", registry=r
        )
        self.dead_letter = Gauge(
            "outbox_events_dead_letter", "Events in the dead letter.", registry=r
        )
        self.oldest_pending_age = Gauge(
            "outbox_oldest_pending_age_seconds",
            "Age of the oldest event still waiting for its first attempt (0 when none).",
            registry=r,
        )

    async def observe_round(self, result: DispatchResult) -> None:
        self.claimed.inc(result.claimed)
        self.published.inc(result.published)
        self.failed.inc(result.failed)
        self.dead_lettered.inc(result.dead_lettered)
        self.lost_leases.inc(result.lost_leases)

    def observe_purged(self, count: int) -> None:
        self.purged.inc(count)

    def observe_storage_error(self) -> None:
        self.storage_errors.inc()

    async def refresh_gauges(self, engine: AsyncEngine) -> None:
        """Set the gauges from the database (counts by status use ix_outbox_events_status_id)."""
        watched = (PENDING, FAILED, PUBLISHING, DEAD_LETTER)
        async with read_only_engine(engine).connect() as conn:
            counts = {
                status: int(count)
                for status, count in await conn.execute(
                    select(t.c.status, func.count())
                    .where(t.c.status.in_(watched))
                    .group_by(t.c.status)
                )
            }
            oldest: datetime | None = (
                await conn.execute(select(func.min(t.c.created_at)).where(t.c.status == PENDING))
            ).scalar_one()
        self.pending.set(counts.get(PENDING, 0))
        self.retrying.set(counts.get(FAILED, 0))
        self.publishing.set(counts.get(PUBLISHING, 0))
        self.dead_letter.set(counts.get(DEAD_LETTER, 0))
        if oldest is None:
            self.oldest_pending_age.set(0)
        else:  # min() keeps the column's type, so this is an aware datetime on every backend
            age = (self._clock() - as_utc(oldest)).total_seconds()
            self.oldest_pending_age.set(max(0.0, age))


def serve_metrics(port: int, registry: CollectorRegistry, *, host: str = "127.0.0.1") -> WSGIServer:
    """Serve ``/metrics`` for ``registry`` from a daemon thread; ``shutdown()`` stops it.

    Binds to loopback unless ``host`` says otherwise; ``port=0`` picks a free
    port (read it from ``server.server_port``).
    """
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
