"""Prometheus metrics for a dispatcher: counters per round, gauges from the database,
and per event type and outcome the lag, the handlers' time and the relay's confirms.

Counters are fed by ``observe_round`` (the ``DispatchObserver`` protocol), so
they count what this process did. The histograms and ``outbox_events_processed_total``
are fed per delivery (``observe_delivery``, engine.dispatch.probe) and per relayed
message (``observe_confirm``, engine.relay.watching), labelled by event type and
outcome: the types the registry declares only (``other`` for anything else), never a
tenant or an id, so their series stay few. Gauges describe the whole outbox and come
from ``OutboxInsights.overview``, the figures ``stats`` prints, in
``refresh_gauges``, which the run loop calls at most every
``housekeeping_seconds`` (not every round). Each ``OutboxMetrics`` owns
its ``CollectorRegistry`` unless given one, so several instances (tests, two
dispatchers in one console) never collide in prometheus-client's global one.
"""

from __future__ import annotations

from collections.abc import Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.clock import Clock, utc_now
from engine.dispatch import DispatchResult
from engine.operating.insights import OutboxInsights
from engine.running.lag import LAG_BUCKETS, LagWindow
from engine.storage.schema import DEAD_LETTER, FAILED, PENDING, PUBLISHING

#: Upper bounds (seconds) of the handler and confirm histograms.
DURATION_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
OTHER_TYPE = "other"
_EVENT_LABELS = ("event_type", "outcome")


class OutboxMetrics:
    """Counters, gauges and histograms of one dispatcher process; ``lag_window``: the last
    minute's lag, which its heartbeat carries (engine.running.lag)."""

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
        self.processed = Counter(
            "outbox_events_processed",
            "Delivery attempts by event type and outcome (published, failed, dead_letter, "
            "lost_lease), as the handlers or the broker answered.",
            _EVENT_LABELS,
            registry=r,
        )
        self.lag = Histogram(
            "outbox_event_lag_seconds",
            "Seconds from an event's creation (its commit) to the start of its processing.",
            _EVENT_LABELS,
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.handler_duration = Histogram(
            "outbox_handler_duration_seconds",
            "Seconds an event's handlers took, one observation per delivery.",
            _EVENT_LABELS,
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.relay_confirm = Histogram(
            "outbox_relay_confirm_seconds",
            "Seconds from a relayed message's publish to the broker's answer.",
            _EVENT_LABELS,
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.lag_window = LagWindow()
        self._known_types: frozenset[str] | None = None
        self._children: dict[tuple[str, str], tuple[Counter, Histogram, Histogram]] = {}

    def label_types(self, event_types: Iterable[str]) -> None:
        """Label only these event types by name (the registry's); any other is ``other``."""
        self._known_types = frozenset(event_types)

    def _type_label(self, event_type: str) -> str:
        known = self._known_types
        return event_type if known is None or event_type in known else OTHER_TYPE

    def observe_delivery(
        self, event_type: str, outcome: str, lag_seconds: float, duration_seconds: float | None
    ) -> None:
        """One attempt at delivering an event (engine.dispatch.probe)."""
        children = self._children.get((event_type, outcome))
        if children is None:
            labels = (self._type_label(event_type), outcome)
            children = (
                self.processed.labels(*labels),
                self.lag.labels(*labels),
                self.handler_duration.labels(*labels),
            )
            self._children[(event_type, outcome)] = children
        processed, lag, duration = children
        processed.inc()
        lag.observe(max(0.0, lag_seconds))
        if duration_seconds is not None:
            duration.observe(duration_seconds)
        self.lag_window.observe(lag_seconds)

    def observe_confirm(self, event_type: str, outcome: str, seconds: float) -> None:
        """One relayed message, ``seconds`` from its publish to the broker's answer."""
        self.relay_confirm.labels(self._type_label(event_type), outcome).observe(seconds)

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
