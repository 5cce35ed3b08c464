"""Prometheus metrics for a dispatcher: counters per round, gauges from the database.

Counters are fed by ``observe_round`` (the ``DispatchObserver`` protocol), so
they count what this process did. Gauges describe the whole outbox and come
from ``OutboxInsights.overview``, the figures ``stats`` prints, in
``refresh_gauges``, which the run loop calls at most every
``housekeeping_seconds`` (not every round). Each ``OutboxMetrics`` owns
its ``CollectorRegistry`` unless given one, so several instances (tests, two
dispatchers in one console) never collide in prometheus-client's global one.
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.clock import Clock, utc_now
from engine.dispatch import DispatchResult
from engine.operating.insights import OutboxInsights
from engine.storage.schema import DEAD_LETTER, FAILED, PENDING, PUBLISHING


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
            "Seconds since the longest-waiting pending event became due: its creation, or "
            "its latest replay (0 when none is pending).",
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
        """Set the gauges from the same overview ``stats`` and the console show."""
        snapshot = await OutboxInsights(engine, clock=self._clock).overview()
        counts = snapshot.counts
        self.pending.set(counts.get(PENDING, 0))
        self.retrying.set(counts.get(FAILED, 0))
        self.publishing.set(counts.get(PUBLISHING, 0))
        self.dead_letter.set(counts.get(DEAD_LETTER, 0))
        self.oldest_pending_age.set(snapshot.oldest_pending_age_seconds or 0.0)


def serve_metrics(port: int, registry: CollectorRegistry, *, host: str = "127.0.0.1") -> WSGIServer:
    """Serve ``/metrics`` for ``registry`` from a daemon thread; ``shutdown()`` stops it.

    Binds to loopback unless ``host`` says otherwise; ``port=0`` picks a free
    port (read it from ``server.server_port``).
    """
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
