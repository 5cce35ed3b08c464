"""Rich renderers: the records of ``outbox_tui.output.records`` as tables and lines for people.

Piped output gets room for a whole row per line (``outbox_tui.output.writer``); narrow
terminals drop columns rather than wrap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich import table as rich_table
from rich.console import RenderableType
from rich.text import Text

from engine.operating.error_groups import ErrorGroups
from engine.operating.insights import TYPE_STATUSES, EventSummary, OverviewSnapshot, TypeCounts
from engine.operating.pauses import PausedBacklog
from outbox_tui.output.records import ReplayReport, SkipReport, stats_record
from outbox_tui.output.values import age, iso
from outbox_tui.safe_text import printable
from outbox_tui.widgets.format import heartbeat_state_text, latency, served_types

_SERVES_CELLS = 40


class Table(rich_table.Table):
    """A rich table whose cells show control characters instead of sending them: row
    values come from the database (see ``printable``)."""

    def add_row(self, *renderables: RenderableType | None, **options: Any) -> None:
        super().add_row(*(_printable_cell(r) for r in renderables), **options)


def _printable_cell(cell: RenderableType | None) -> RenderableType | None:
    if isinstance(cell, str):
        return printable(cell)
    if isinstance(cell, Text) and printable(cell.plain) != cell.plain:
        return Text(printable(cell.plain), style=cell.style)
    return cell


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
    width: int | None = None,
    inbound_retention_seconds: float | None = None,
) -> list[Table | Text]:
    """``width``: the terminal's, if known (the heartbeats' serves column fits it)."""
    record = stats_record(
        snapshot,
        database_url,
        pauses=pauses,
        top_types=top_types,
        inbound_retention_seconds=inbound_retention_seconds,
    )
    overview = Table(title="outbox", title_justify="left", show_header=False)
    overview.add_column("what", style="bold")
    overview.add_column("value", justify="right")
    overview.add_row("database", database_url)
    for status, count in record["counts"].items():
        overview.add_row(status, str(count))
    overview.add_row("total", str(record["total"]))
    overview.add_row("oldest pending age", age(record["oldest_pending_age_seconds"]))
    if record["lag"] is not None:
        lag = record["lag"]
        overview.add_row(
            f"lag p50 / p90 / p99 (last {age(lag['window_seconds'])}, {lag['events']} events)",
            " / ".join(latency(lag[f"p{q}_seconds"]) for q in (50, 90, 99)),
        )
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
    overview.add_row(
        "held behind dead letters (replay or skip the head)", str(record["held_by_dead_letters"])
    )
    if record["inbound_rows"] is not None:
        window = age(record["inbound_retention_seconds"])
        overview.add_row(
            f"inbound events remembered (dedup window {window})", str(record["inbound_rows"])
        )
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
    dispatchers = [hb for hb in record["heartbeats"] if hb["kind"] != "consumer"]
    consumers = [hb for hb in record["heartbeats"] if hb["kind"] == "consumer"]
    if consumers:
        tables.append(_consumers_table(consumers))
    if not dispatchers:
        tables.append(Text("no dispatcher heartbeats yet (none has run against this database)"))
        return tables
    beats = Table(title="dispatchers (heartbeats)", title_justify="left")
    beats.add_column("instance", no_wrap=True)
    for name in ("host", "pid", "state", "last seen", "iterations", "published"):
        beats.add_column(name)
    beats.add_column("failed")
    beats.add_column("dead")
    # The types each dispatcher claims, cut to the room (``orders.placed, … (3 types)``):
    # only while some heartbeat says (earlier versions did not), and not below 100 columns.
    serves = _SERVES_CELLS if width is None else min(_SERVES_CELLS, width - 90)
    serves_shown = (width is None or width >= 100) and any(
        hb["serves"] is not None for hb in record["heartbeats"]
    )
    if serves_shown:
        beats.add_column("serves", no_wrap=True, overflow="ellipsis")
    for hb in dispatchers:
        served = [served_types(hb["serves"], serves)] if serves_shown else []
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
            *served,
        )
    tables.append(beats)
    return tables


def _consumers_table(consumers: list[dict[str, Any]]) -> Table:
    """The inbox consumers (``outbox-tui consume``): where they read, what they stored."""
    table = Table(title="inbox consumers (heartbeats)", title_justify="left")
    table.add_column("instance", no_wrap=True)
    for name in ("host", "pid", "state", "last seen", "queue"):
        table.add_column(name)
    for name in ("received", "stored", "duplicates", "rejected"):
        table.add_column(name, justify="right")
    for hb in consumers:
        totals = hb["totals"]
        table.add_row(
            hb["instance_id"],
            hb["host"],
            str(hb["pid"]),
            heartbeat_state_text(hb["state"], hb["waiting_for"]),
            age(hb["last_seen_age_seconds"]) + " ago",
            hb["queue"] or "-",
            *(str(totals[name]) for name in ("received", "stored", "duplicates", "rejected")),
        )
    return table


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
