"""What the command line prints: stable JSON records and rich text for people.

Every command builds its JSON record here (so the keys documented in
``docs/cli.md`` live in one module) and renders the same data as rich tables
for a terminal. Errors are written as exactly one plain line: rich never wraps
or decorates them, so scripts can match ``outbox-tui: error: ...``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from engine.error_groups import ErrorGroup, ErrorGroups
from engine.insights import TYPE_STATUSES, EventSummary, HeartbeatView, OverviewSnapshot, TypeCounts
from engine.pauses import PausedBacklog
from outbox_tui import PROG
from outbox_tui.widgets.format import heartbeat_state_text

COUNTERS = ("claimed", "published", "failed", "dead_lettered", "lost_leases")
HEARTBEAT_TOTALS = (*COUNTERS, "purged", "storage_errors")
# A run's totals that change only when an iteration did something.
WORK_TOTALS = HEARTBEAT_TOTALS


# -- plain values ----------------------------------------------------------------------


def iso(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with a ``Z`` suffix (``2026-01-01T12:00:00.000000Z``)."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def age(value: float | None) -> str:
    """A short human age: ``4.2s``, ``3m 5s``, ``2h 10m``, ``3d 4h``."""
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.1f}s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m {secs}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def rate(count: int, elapsed: float) -> float:
    return round(count / elapsed, 2) if elapsed > 0 else 0.0


# -- JSON records ----------------------------------------------------------------------


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


def heartbeat_record(hb: HeartbeatView) -> dict[str, Any]:
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
        "totals": {name: hb.total(name) for name in HEARTBEAT_TOTALS},
        "waiting_for": hb.waiting_for,
        "serves": hb.serves,
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
) -> dict[str, Any]:
    """``database_url`` must already be masked."""
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
        "blocked_keys": snapshot.blocked_keys,
        "oldest_blocked_head_at": iso(snapshot.oldest_blocked_head_at),
        "oldest_blocked_head_age_seconds": seconds(snapshot.oldest_blocked_head_age_seconds),
        "heartbeats": [heartbeat_record(hb) for hb in snapshot.heartbeats],
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
        # Active pauses (engine.pauses), oldest first, with the events each holds back.
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
    dedup_note: str | None = None  # engine.replay.DedupCheck.warning(), for people
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


# -- the writer ------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def _width(stream: TextIO) -> int | None:
    """Let rich measure a terminal; give anything else room for a whole table row."""
    try:
        return None if stream.isatty() else 200
    except (AttributeError, ValueError):
        return 200


class Output:
    """stdout for results (JSON or rich), stderr for errors, progress and status."""

    def __init__(
        self, *, json_mode: bool, stdout: TextIO | None = None, stderr: TextIO | None = None
    ) -> None:
        self.json_mode = json_mode
        self._stdout = stdout or sys.stdout
        self._stderr = stderr or sys.stderr
        # Piped or redirected output keeps one row per line instead of rich's 80 columns.
        self.console = Console(file=self._stdout, highlight=False, width=_width(self._stdout))
        self.err_console = Console(file=self._stderr, highlight=False, width=_width(self._stderr))

    @property
    def stderr(self) -> TextIO:
        return self._stderr

    def json(self, record: Any) -> None:
        """One compact JSON value on one line, flushed at once (for pipes and tests)."""
        self._stdout.write(json.dumps(record, default=_json_default, sort_keys=False) + "\n")
        self._stdout.flush()

    def error(self, message: str) -> None:
        """``outbox-tui: error: <message>`` as one line on stderr, no markup."""
        line = " ".join(str(message).split())
        self._stderr.write(f"{PROG}: error: {line}\n")
        self._stderr.flush()

    def note(self, message: str) -> None:
        """A short human remark on stderr (never in JSON mode's stdout)."""
        self.err_console.print(Text(message, style="dim"), soft_wrap=True)

    def say(self, message: str) -> None:
        """A one-line human result on stdout (text mode)."""
        self.console.print(Text(message), soft_wrap=True)


# -- rich renderers --------------------------------------------------------------------


def _cell(value: Any, limit: int = 60) -> str:
    if value is None:
        return "-"
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def dead_letters_table(
    events: Sequence[EventSummary], *, has_more: bool, width: int = 200
) -> Table:
    """One line per dead letter, fitted to ``width``: narrow terminals drop columns first.

    Ids are for copying and never shortened; the reason gets what is left.
    """
    title = f"{len(events)} dead letter(s)" + (" (more: raise --limit)" if has_more else "")
    columns: list[tuple[str, int, Callable[[EventSummary], str]]] = [
        ("id", 36, lambda e: e.id),
        ("type", 22 if width >= 100 else 18, lambda e: f"{e.event_type} v{e.event_version}"),
    ]
    if width >= 100:
        columns.append(("attempts", 8, lambda e: str(e.attempt_count)))
    if width >= 120:
        columns.insert(1, ("tenant", 10, lambda e: e.tenant_id))
    if width >= 160:
        columns += [
            ("aggregate", 24, lambda e: f"{e.aggregate_type}/{e.aggregate_id}"),
            ("replays", 7, lambda e: str(e.replay_count)),
            ("created (UTC)", 19, lambda e: e.created_at.strftime("%Y-%m-%d %H:%M:%S")),
        ]
    borders = 3 * (len(columns) + 1) + 1
    reason_width = max(16, width - borders - sum(w for _n, w, _f in columns))
    table = Table(title=title, title_justify="left", expand=False)
    for name, column_width, _fn in columns:
        table.add_column(
            name,
            no_wrap=True,
            overflow="ellipsis",
            max_width=column_width,
            min_width=column_width if name == "id" else None,
        )
    table.add_column("reason", no_wrap=True, overflow="ellipsis", max_width=reason_width)
    for e in events:
        cells = [fn(e) for _n, _w, fn in columns]
        table.add_row(*cells, _cell(e.dead_letter_reason or e.last_error, limit=reason_width))
    return table


def stats_tables(
    snapshot: OverviewSnapshot,
    database_url: str,
    *,
    pauses: Sequence[PausedBacklog] = (),
    top_types: Sequence[TypeCounts] = (),
) -> list[Table | Text]:
    record = stats_record(snapshot, database_url, pauses=pauses, top_types=top_types)
    overview = Table(title="outbox", title_justify="left", show_header=False)
    overview.add_column("what", style="bold")
    overview.add_column("value", justify="right")
    overview.add_row("database", database_url)
    for status, count in record["counts"].items():
        overview.add_row(status, str(count))
    overview.add_row("total", str(record["total"]))
    overview.add_row("oldest pending age", age(record["oldest_pending_age_seconds"]))
    overview.add_row("stuck in publishing (lease expired)", str(record["stuck_publishing"]))
    window = age(record["recent_window_seconds"])
    overview.add_row(f"published in the last {window}", str(record["published_recent"]))
    purge = record["awaiting_purge"]
    overview.add_row(
        "awaiting retention purge",
        "- (give --retention-seconds)" if purge is None else str(purge),
    )
    overview.add_row(
        "blocked ordering keys (failed or dead-letter head)", str(record["blocked_keys"])
    )
    overview.add_row("oldest blocked head age", age(record["oldest_blocked_head_age_seconds"]))
    tables: list[Table | Text] = [overview]
    if record["unserved"]:
        unserved = Table(title="no dispatcher serves these (they wait)", title_justify="left")
        for name in ("event type", "waiting", "oldest"):
            unserved.add_column(name)
        for u in record["unserved"]:
            unserved.add_row(u["event_type"], str(u["count"]), age(u["oldest_age_seconds"]))
        tables.append(unserved)
    if record["pauses"]:
        paused = Table(title="paused (not delivered until resumed)", title_justify="left")
        for name in ("event type", "tenant", "since", "by", "waiting", "reason"):
            paused.add_column(name)
        for p in record["pauses"]:
            paused.add_row(
                p["event_type"],
                p["tenant_id"] or "every tenant",
                p["since"][:19].replace("T", " "),
                p["by"],
                str(p["waiting"]),
                _cell(p["reason"]),
            )
        tables.append(paused)
    if record["top_types"]:
        top = Table(title="top types (undelivered)", title_justify="left")
        top.add_column("event type")
        for status in TYPE_STATUSES:
            top.add_column(status, justify="right")
        for row in record["top_types"]:
            top.add_row(row["event_type"], *(str(row["counts"][s]) for s in TYPE_STATUSES))
        tables.append(top)
    if not record["heartbeats"]:
        tables.append(Text("no dispatcher heartbeats yet (none has run against this database)"))
        return tables
    beats = Table(title="dispatchers (heartbeats)", title_justify="left")
    beats.add_column("instance", no_wrap=True)
    for name in ("host", "pid", "state", "last seen", "iterations", "published"):
        beats.add_column(name)
    beats.add_column("failed")
    beats.add_column("dead")
    for hb in record["heartbeats"]:
        beats.add_row(
            hb["instance_id"],
            hb["host"],
            str(hb["pid"]),
            heartbeat_state_text(hb["state"], hb["waiting_for"]),
            age(hb["last_seen_age_seconds"]) + " ago",
            str(hb["iterations"]),
            str(hb["totals"]["published"]),
            str(hb["totals"]["failed"]),
            str(hb["totals"]["dead_lettered"]),
        )
    tables.append(beats)
    return tables


def dedup_warning(report: ReplayReport) -> str | None:
    """The dedup-window line of a replay report, or None when every event is inside it."""
    return report.dedup_note if report.outside_dedup_window else None


def replay_text(report: ReplayReport) -> list[str]:
    if report.dry_run:
        lines = [f"dry run: {report.matched} dead letter(s) would be replayed (nothing changed)"]
        lines += [f"  {n:>6}  {event_type}" for event_type, n in report.by_type.items()]
        lines += [f"  would refuse {i}: {why}" for i, why in report.refused.items()]
        warning = dedup_warning(report)
        if warning:
            lines.append(f"warning: {warning}")
        return lines
    lines = [f"replayed {i}" for i in report.replayed]
    lines.append(
        f"{len(report.replayed)} replayed, {len(report.refused)} refused "
        f"(operator {report.operator}" + (f", reason {report.reason!r})" if report.reason else ")")
    )
    return lines


def error_groups_table(found: ErrorGroups, *, width: int | None = None) -> Table:
    title = f"error groups ({found.scanned} failed and dead-letter rows"
    title += ")" if found.complete else ", the newest only: the scan stopped at its limit)"
    table = Table(title=title, title_justify="left")
    table.add_column("fingerprint", no_wrap=True)
    table.add_column("count", justify="right")
    table.add_column("statuses")
    table.add_column("types")
    table.add_column("tenants")
    table.add_column("first seen", no_wrap=True)
    table.add_column("last seen", no_wrap=True)
    table.add_column("error")
    for group in found.groups:
        table.add_row(
            group.fingerprint,
            str(group.count),
            _counts(group.statuses),
            _counts(group.event_types),
            _counts(group.tenants),
            (iso(group.first_seen) or "-")[:19].replace("T", " "),
            (iso(group.last_seen) or "-")[:19].replace("T", " "),
            _cell(group.message, limit=max(30, (width or 120) - 100)),
        )
    return table


def _counts(counter: Mapping[str, int], shown: int = 3) -> str:
    items = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{name} {n}" for name, n in items[:shown])
    return text + (f", +{len(items) - shown} more" if len(items) > shown else "")


def _waiting(n: int) -> str:
    return f"{n} waiting event{'' if n == 1 else 's'}"


def skip_text(report: SkipReport) -> list[str]:
    if report.dry_run:
        lines = [f"dry run: {report.matched} dead letter(s) would be skipped (nothing changed)"]
        lines += [
            f"  would skip {i}: releases {_waiting(n)} of key {report.keys.get(i)}"
            for i, n in report.released.items()
        ]
        return lines
    lines = [
        f"skipped {i}: released {_waiting(report.released.get(i, 0))} of key {report.keys.get(i)}"
        for i in report.skipped
    ]
    released = sum(report.released.get(i, 0) for i in report.skipped)
    lines.append(
        f"{len(report.skipped)} skipped ({_waiting(released)} released), "
        f"{len(report.refused)} refused (operator {report.operator}"
        + (f", reason {report.reason!r})" if report.reason else ")")
    )
    return lines


def counters_table(title: str, counters: Mapping[str, Any]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("counter", style="bold")
    table.add_column("value", justify="right")
    for name, value in counters.items():
        table.add_row(name.replace("_", " "), _human(value))
    return table


def _human(value: Any) -> str:
    """Booleans as yes/no and nothing as a dash, as an operator reads them."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "-" if value is None else str(value)


# -- the headless run loop -------------------------------------------------------------


@dataclass(slots=True)
class RunClock:
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


def status_line(totals: Mapping[str, Any], elapsed: float) -> Text:
    line = Text("dispatching ", style="bold")
    line.append(f"iterations {totals.get('iterations', 0)}  ")
    line.append(f"claimed {totals.get('claimed', 0)}  ")
    line.append(f"published {totals.get('published', 0)}  ", style="green")
    line.append(f"failed {totals.get('failed', 0)}  ", style="yellow")
    line.append(f"dead-lettered {totals.get('dead_lettered', 0)}  ", style="red")
    line.append(f"{rate(int(totals.get('published', 0)), elapsed)}/s  ")
    line.append(f"up {age(elapsed)}", style="dim")
    return line


class RunReporter:
    """Reports a ``--dispatch`` run: JSON lines on stdout, or a live status line on stderr.

    JSON mode writes ``started`` first, ``iteration`` for every iteration whose
    totals changed (it did work, purged, or hit a storage error), ``idle`` at
    most every ``idle_every`` seconds while nothing happens, and ``summary`` last.
    """

    def __init__(self, out: Output, *, idle_every: float = 10.0) -> None:
        self.out = out
        self.idle_every = idle_every
        self.clock = RunClock()
        self._last_line = self.clock.started
        self._previous = _work_totals({})
        self._live: Live | None = None

    def started(self, details: Mapping[str, Any]) -> None:
        self.clock = RunClock()
        self._last_line = self.clock.started
        if self.out.json_mode:
            self.out.json({"event": "started", **details})
            return
        self.out.note(
            f"dispatching as {details.get('instance_id')} from {details.get('database_url')}"
            " (Ctrl-C or SIGTERM to stop after the current batch)"
        )
        if self.out.err_console.is_terminal:
            self._live = Live(
                status_line({}, 0.0), console=self.out.err_console, refresh_per_second=4
            )
            self._live.start()

    def iteration(self, totals: Mapping[str, Any], result: Mapping[str, int]) -> None:
        elapsed = self.clock.elapsed
        if self._live is not None:
            self._live.update(status_line(totals, elapsed))
        if not self.out.json_mode:
            return
        changed = _work_totals(totals) != self._previous
        now = time.monotonic()
        if changed:
            self._previous = _work_totals(totals)
            self.out.json(
                {
                    "event": "iteration",
                    "iteration": totals.get("iterations", 0),
                    **{name: int(result.get(name, 0)) for name in COUNTERS},
                    "totals": dict(totals),
                    "elapsed_seconds": seconds(elapsed),
                    "rate_per_second": rate(int(totals.get("published", 0)), elapsed),
                }
            )
            self._last_line = now
        elif now - self._last_line >= self.idle_every:
            self.out.json(
                {
                    "event": "idle",
                    "iteration": totals.get("iterations", 0),
                    "totals": dict(totals),
                    "elapsed_seconds": seconds(elapsed),
                }
            )
            self._last_line = now

    def finished(self, totals: Mapping[str, Any], instance_id: str) -> None:
        self.stop()
        elapsed = self.clock.elapsed
        record = {
            "event": "summary",
            **totals,
            "instance_id": instance_id,
            "elapsed_seconds": seconds(elapsed),
            "rate_per_second": rate(int(totals.get("published", 0)), elapsed),
        }
        if self.out.json_mode:
            self.out.json(record)
        else:
            shown = {k: v for k, v in record.items() if k != "event"}
            self.out.console.print(counters_table("dispatch run summary", shown))

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def _work_totals(totals: Mapping[str, Any]) -> dict[str, Any]:
    return {name: totals.get(name, 0) for name in WORK_TOTALS}
