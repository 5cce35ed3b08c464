"""The command line's JSON records: every key documented in ``docs/cli.md`` is built here.

Each command prints one of these with ``--json`` and renders the same record (or the
report it came from) as rich text for people (``outbox_tui.output.tables``).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from engine.operating.error_groups import ErrorGroup, ErrorGroups
from engine.operating.insights import (
    TYPE_STATUSES,
    EventDetail,
    EventSummary,
    HeartbeatView,
    OverviewSnapshot,
    TypeCounts,
)
from engine.operating.pauses import PausedBacklog
from outbox_tui.output.values import iso, seconds

COUNTERS = ("claimed", "published", "failed", "dead_lettered", "lost_leases")
HEARTBEAT_TOTALS = (*COUNTERS, "purged", "storage_errors")
#: A consumer's totals (engine.inbox.heartbeat.ConsumerTotals), in the order they are shown.
CONSUMER_TOTALS = (
    "received",
    "stored",
    "duplicates",
    "rejected",
    "unknown_types",
    "acked",
    "batches",
    "storage_errors",
    "reconnects",
)


def dead_letter_record(event: EventSummary) -> dict[str, Any]:
    return {
        "id": event.id,
        "tenant_id": event.tenant_id,
        "event_type": event.event_type,
        "event_version": event.event_version,
        "aggregate_type": event.aggregate_type,
        "aggregate_id": event.aggregate_id,
        "attempt_count": event.attempt_count,
        "last_error": event.last_error,
        "dead_letter_reason": event.dead_letter_reason,
        "created_at": iso(event.created_at),
        "replay_count": event.replay_count,
        "ordering_key": event.ordering_key,
    }


def _plain(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's columns, with timestamps as ISO 8601 text and bytes (an undecodable inbound
    message's ``inbound_body``) as base64."""
    return {k: _plain_value(v) for k, v in row.items()}


def _plain_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return value


def event_detail_record(detail: EventDetail) -> dict[str, Any]:
    """``outbox-tui event ID --json``: the event's columns, then what the detail adds."""
    return {
        **_plain(detail.columns),
        "payload": detail.payload,
        "payload_error": detail.payload_error,
        "chain_id": detail.chain_id,
        # The stored trace context, read: the trace id (else the payload's trace_id) and
        # the span the event's own spans hang under.
        "trace_id": detail.trace_id,
        "parent_span_id": None if detail.trace_parent is None else detail.trace_parent.span_id,
        "chain": [_plain(link) for link in detail.chain],
        "earlier_in_key": detail.earlier_in_key,
        "handler_runs": [_plain(run) for run in detail.handler_runs],
        "side_effects": [_plain(effect) for effect in detail.side_effects],
        "replays": [_plain(replay) for replay in detail.replays],
    }


def heartbeat_record(hb: HeartbeatView) -> dict[str, Any]:
    """A dispatcher's or an inbox consumer's heartbeat (``kind``); a consumer's ``totals``
    are its own (``CONSUMER_TOTALS``), and it names its ``queue``."""
    names = CONSUMER_TOTALS if hb.is_consumer else HEARTBEAT_TOTALS
    return {
        "instance_id": hb.instance_id,
        "kind": hb.kind,
        "host": hb.host,
        "pid": hb.pid,
        "state": hb.state,
        "started_at": iso(hb.started_at),
        "last_seen_at": iso(hb.last_seen_at),
        "last_seen_age_seconds": seconds(hb.last_seen_age_seconds),
        "iterations": hb.iterations,
        "totals": {name: hb.total(name) for name in names},
        "waiting_for": hb.waiting_for,
        "serves": hb.serves,
        "queue": hb.queue,
    }


def lag_record(snapshot: OverviewSnapshot) -> dict[str, Any] | None:
    lag = snapshot.lag
    if lag is None:
        return None
    return {
        "window_seconds": lag.window_seconds,
        "events": lag.events,
        "dispatchers": lag.dispatchers,
        "p50_seconds": seconds(lag.p50_seconds),
        "p90_seconds": seconds(lag.p90_seconds),
        "p99_seconds": seconds(lag.p99_seconds),
    }


def pause_record(held: PausedBacklog) -> dict[str, Any]:
    p = held.pause
    return {
        "event_type": p.event_type,
        "tenant_id": p.tenant_id,
        "since": iso(p.paused_at),
        "by": p.paused_by,
        "reason": p.reason,
        "waiting": held.waiting,
    }


def type_counts_record(counts: TypeCounts) -> dict[str, Any]:
    return {
        "event_type": counts.event_type,
        "counts": {s: int(counts.counts.get(s, 0)) for s in TYPE_STATUSES},
        "undelivered": counts.undelivered,
    }


def error_group_record(group: ErrorGroup) -> dict[str, Any]:
    return {
        "fingerprint": group.fingerprint,
        "message": group.message,
        "count": group.count,
        "statuses": dict(group.statuses.most_common()),
        "event_types": dict(group.event_types.most_common()),
        "tenants": dict(group.tenants.most_common()),
        "first_seen": iso(group.first_seen),
        "last_seen": iso(group.last_seen),
        "example_error": group.example_error,
    }


def error_groups_record(found: ErrorGroups) -> dict[str, Any]:
    return {
        "complete": found.complete,
        "scanned": found.scanned,
        "groups": [error_group_record(g) for g in found.groups],
    }


def stats_record(
    snapshot: OverviewSnapshot,
    database_url: str,
    *,
    pauses: Sequence[PausedBacklog] = (),
    top_types: Sequence[TypeCounts] = (),
    inbound_retention_seconds: float | None = None,
) -> dict[str, Any]:
    """``database_url`` must already be masked; ``inbound_retention_seconds``: the inbox's
    dedup window the dispatchers apply."""
    counts = {name: int(n) for name, n in snapshot.counts.items()}
    return {
        "database_url": database_url,
        "taken_at": iso(snapshot.taken_at),
        "counts": counts,
        "total": sum(counts.values()),
        "oldest_pending_at": iso(snapshot.oldest_pending_at),
        "oldest_pending_age_seconds": seconds(snapshot.oldest_pending_age_seconds),
        "stuck_publishing": snapshot.stuck_publishing,
        "published_recent": snapshot.published_recent,
        "recent_window_seconds": snapshot.recent_window_seconds,
        "awaiting_purge": snapshot.awaiting_purge,
        "retention_seconds": snapshot.retention_seconds,
        # The inbox: inbound events remembered (a copy is refused) and for how long.
        "inbound_rows": snapshot.inbound_rows,
        "inbound_retention_seconds": inbound_retention_seconds,
        "blocked_keys": snapshot.blocked_keys,
        "oldest_blocked_head_at": iso(snapshot.oldest_blocked_head_at),
        "oldest_blocked_head_age_seconds": seconds(snapshot.oldest_blocked_head_age_seconds),
        # Pending or failed events behind a dead-lettered head: they wait for an operator.
        "held_by_dead_letters": snapshot.held_by_dead_letters,
        "heartbeats": [heartbeat_record(hb) for hb in snapshot.heartbeats],
        # The last minute's outbox lag (creation to start of processing) over the live
        # dispatchers that measure it (run with metrics); null when none does.
        "lag": lag_record(snapshot),
        # Waiting events of types no live dispatcher serves: they stay pending.
        "unserved": [
            {
                "event_type": u.event_type,
                "count": u.count,
                "oldest_created_at": iso(u.oldest_created_at),
                "oldest_age_seconds": seconds(u.oldest_age_seconds),
            }
            for u in snapshot.unserved
        ],
        # Active pauses (engine.operating.pauses), oldest first, with the events each holds back.
        "pauses": [pause_record(p) for p in pauses],
        # Event types with the most undelivered events, by status.
        "top_types": [type_counts_record(c) for c in top_types],
    }


@dataclass(slots=True)
class ReplayReport:
    """What a replay did (or, for a dry run, would do)."""

    dry_run: bool
    operator: str
    reason: str | None
    matched: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    replayed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    # Of the matched events, those created before the consumers' dedup window.
    outside_dedup_window: int = 0
    dedup_window_seconds: float | None = None
    # Set when the replay was refused as a whole (outside the dedup window).
    refused_all: str | None = None
    dedup_note: str | None = None  # engine.operating.replay.DedupCheck.warning(), for people
    group_failed: int = 0  # --group without dead letters: its failed rows (they retry)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "matched": self.matched,
            "by_type": dict(self.by_type),
            "replayed": list(self.replayed),
            "refused": dict(self.refused),
            "operator": self.operator,
            "reason": self.reason,
            "outside_dedup_window": self.outside_dedup_window,
            "dedup_window_seconds": self.dedup_window_seconds,
            "refused_all": self.refused_all,
        }


@dataclass(slots=True)
class SkipReport:
    """What a skip did (or, for a dry run, would do), and what each skip releases."""

    dry_run: bool
    operator: str
    reason: str | None
    matched: int = 0
    skipped: list[str] = field(default_factory=list)
    released: dict[str, int] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "matched": self.matched,
            "skipped": list(self.skipped),
            "released": dict(self.released),
            "ordering_keys": dict(self.keys),
            "refused": dict(self.refused),
            "operator": self.operator,
            "reason": self.reason,
        }


def dispatch_once_record(result: Mapping[str, int], dispatcher_id: str) -> dict[str, Any]:
    return {"dispatcher_id": dispatcher_id, **{name: int(result[name]) for name in COUNTERS}}
