"""Small, pure formatting helpers shared by the widgets (ages, counts, statuses)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from rich.cells import cell_len
from rich.text import Text

from engine.service.catalog import CatalogEntry, CatalogInbox
from outbox_tui.safe_text import printable

# Rich styles: cells and detail sections are Rich renderables (no Textual variables).
RICH_STATUS_STYLES = {
    "pending": "bold #5fafff",
    "publishing": "bold #d7afff",
    "published": "#87d787",
    "failed": "bold #ffaf5f",
    "dead_letter": "bold #ff5f5f",
}
HEARTBEAT_STYLES = {"alive": "bold #87d787", "stale": "bold #ffaf5f", "stopped": "#8a8a8a"}
STATUS_LABELS = {"dead_letter": "dead letter"}


def status_text(status: str) -> Text:
    return Text(STATUS_LABELS.get(status, status), style=RICH_STATUS_STYLES.get(status, ""))


def latency(seconds: float | None) -> str:
    """``12ms`` below a second, else as ``duration`` says it."""
    if seconds is not None and seconds < 1:
        return f"{max(0.0, seconds) * 1000:.0f}ms"
    return duration(seconds)


def duration(seconds: float | None) -> str:
    """``42s``, ``4m 12s``, ``5m``, ``3h 05m``, ``2d 4h``; an em dash for None."""
    if seconds is None:
        return "—"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s" if secs else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


def age(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "—"
    return duration((now - moment).total_seconds())


def relative(moment: datetime | None, now: datetime) -> str:
    """``in 12s`` for the future, ``5s ago`` for the past, ``now``; an em dash for None."""
    if moment is None:
        return "—"
    delta = (moment - now).total_seconds()
    if delta >= 1:
        return f"in {duration(delta)}"
    if delta > -1:
        return "now"
    return f"{duration(-delta)} ago"


def timestamp(moment: datetime | None) -> str:
    if moment is None:
        return "—"
    return moment.strftime("%Y-%m-%d %H:%M:%S") + "Z"


def count(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


_UNITS = (("k", 1_000), ("M", 1_000_000), ("B", 1_000_000_000), ("T", 1_000_000_000_000))


def compact(value: int | None) -> str:
    """A count in at most five characters, never cut: ``9,999``, ``12.3k``, ``456k``, ``1.0M``.

    Below 10,000 the exact number; above, three significant digits and a unit, rounded
    (so 999,999 reads ``1.0M``, not ``1,000k``). An em dash for None.
    """
    if value is None:
        return "—"
    if abs(value) < 10_000:
        return f"{value:,}"
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    for index, (unit, size) in enumerate(_UNITS):
        scaled = magnitude / size
        text = f"{scaled:.1f}" if scaled < 99.95 else f"{scaled:.0f}"
        if float(text) < 1000 or index == len(_UNITS) - 1:
            return f"{sign}{text}{unit}"
    raise AssertionError("unreachable")


def fitted(value: int | None, width: int) -> str:
    """The exact count when it fits in ``width`` cells, else ``compact``: never a cut number."""
    exact = count(value)
    return exact if len(exact) <= width else compact(value)


def short_id(event_id: str) -> str:
    """The tail of a UUIDv7: the head is a timestamp shared by neighbours."""
    event_id = printable(event_id)
    return "…" + event_id[-12:] if len(event_id) > 13 else event_id


def one_line(value: Any, width: int | None = None) -> str:
    """A stored value on one line, control characters spelled out (``printable``)."""
    text = printable(" ".join(str(value).split())) if value is not None else ""
    if width is not None and len(text) > width:
        return text[: max(0, width - 1)] + "…"
    return text


def plural(value: int, noun: str) -> str:
    """``1 type``, ``3 types``, ``1,200 events``."""
    return f"{value:,} {noun}" if value == 1 else f"{value:,} {noun}s"


def fit_list(
    items: Sequence[str], width: int, more: Callable[[int], str], sep: str = ", "
) -> str | None:
    """``items`` joined in order within ``width`` cells; when not all of them fit, as many
    as fit followed by ``more(number left out)``; None when not even one does."""
    whole = sep.join(items)
    if cell_len(whole) <= width:
        return whole
    for shown in range(len(items) - 1, 0, -1):
        text = sep.join(items[:shown]) + more(len(items) - shown)
        if cell_len(text) <= width:
            return text
    return None


def served_types(types: Sequence[str] | None, width: int) -> str:
    """What a dispatcher claims, in at most ``width`` cells (down to ``12 types``).

    ``orders.placed, orders.cancelled`` while the names fit, then
    ``orders.placed, … (3 types)``, then ``3 types``. An em dash for a dispatcher of an
    earlier version that did not say (it claims every type); ``nothing`` for none.
    """
    if types is None:
        return "—"
    if not types:
        return "nothing"
    total = plural(len(types), "type")
    fitted_names = fit_list(types, width, lambda _left: f", … ({total})")
    if fitted_names is not None:
        return fitted_names
    return one_line(types[0], width) if len(types) == 1 and width >= 8 else total


MUTED_STYLE = "#8a8a8a"


def heartbeat_state_text(state: str, waiting_for: str | None) -> Text:
    """A dispatcher's or consumer's state; an alive one that waits for its broker (or, a
    consumer, for the database) says so."""
    if state == "alive" and waiting_for:
        what = "database" if waiting_for.startswith("database") else "broker"
        return Text(f"alive · waiting for {what}", style=HEARTBEAT_STYLES["stale"])
    return Text(state, style=HEARTBEAT_STYLES.get(state, ""))


def catalog_versions(entry: CatalogEntry) -> str:
    """``v1 OrderPlaced, v2 fields``: an event type's versions and what their schemas are."""
    return ", ".join(f"v{v.version} {v.model or v.schema_kind}" for v in entry.versions)


def catalog_handlers(entry: CatalogEntry) -> str:
    """Its handlers' keys, ``(tx)`` after a transactional one; ``-`` for none."""
    keys = [h.key + (" (tx)" if h.transactional else "") for h in entry.handlers]
    return ", ".join(keys) or "-"


def catalog_ordering(entry: CatalogEntry) -> str:
    if entry.ordering_key is None:
        return "unordered"
    return f"by {entry.ordering_key}, dead letter: {entry.on_dead_letter}"


def catalog_inbox(inbox: CatalogInbox) -> list[str]:
    """The inbox in lines: its queue, then each binding with the registered types it
    routes (``→ no registered type``: its events would wait unserved). Empty when no
    queue or binding is given."""
    if not inbox.configured:
        return []
    queue = f"queue {inbox.queue}" if inbox.queue else "no queue given"
    lines = [f"inbox: {queue}" + ("" if inbox.bindings else ", no bindings given")]
    for binding in inbox.bindings:
        types = ", ".join(binding.event_types) or "no registered type"
        lines.append(f"  {binding.name} → {types}")
    return lines
