"""Everything about one event: columns, lease, errors, payload, replays, handler records."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.json import JSON
from rich.rule import Rule
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from engine.insights import EventDetail
from outbox_tui.widgets.format import (
    MUTED_STYLE,
    one_line,
    relative,
    status_text,
    timestamp,
)

LABEL = "#8a8a8a"
ERROR = "#ff8787"


def _when(moment: datetime | None, now: datetime) -> Text:
    if moment is None:
        return Text("—", style=MUTED_STYLE)
    return Text.assemble(timestamp(moment), (f"  {relative(moment, now)}", MUTED_STYLE))


def _grid(rows: Sequence[tuple[str, RenderableType]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style=LABEL, no_wrap=True, min_width=16)
    grid.add_column(overflow="fold")
    for label, value in rows:
        grid.add_row(label, value)
    return grid


def _section(title: str) -> Rule:
    return Rule(Text(title, style="bold"), style="#444444", align="left")


def _records(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]], now: datetime
) -> RenderableType:
    if not rows:
        return Text("none", style=MUTED_STYLE)
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style=LABEL, expand=False)
    for _key, label in columns:
        table.add_column(label, overflow="fold")
    for row in rows:
        cells: list[RenderableType] = []
        for key, _label in columns:
            value = row.get(key)
            if isinstance(value, datetime):
                cells.append(Text(relative(value, now)))
            elif key == "status":
                ok = value == "succeeded"
                cells.append(Text(str(value), style="#87d787" if ok else ERROR))
            elif value is None or value == "":
                cells.append(Text("—", style=MUTED_STYLE))
            else:
                cells.append(Text(one_line(value, 200)))
        table.add_row(*cells)
    return table


def render_detail(detail: EventDetail, now: datetime) -> RenderableType:
    """The whole detail as one Rich renderable (also used by tests to read it as text)."""
    c = detail.columns
    status = str(c.get("status", ""))
    title = Text.assemble(status_text(status), "  ", (str(c.get("id", "")), "bold"))
    identity = _grid(
        [
            ("type", Text(f"{c.get('event_type')} v{c.get('event_version')}")),
            ("tenant", Text(str(c.get("tenant_id")))),
            ("aggregate", Text(f"{c.get('aggregate_type')}:{c.get('aggregate_id')}")),
            ("trace id", Text(detail.trace_id or "—")),
            ("created", _when(c.get("created_at"), now)),
        ]
    )
    locked_until = c.get("locked_until")
    lease_state = ""
    if locked_until is not None:
        lease_state = "  (expired)" if locked_until < now else "  (held)"
    delivery = _grid(
        [
            ("attempts", Text(f"{c.get('attempt_count')} of {c.get('max_attempts')}")),
            ("next retry", _when(c.get("next_retry_at"), now)),
            ("published", _when(c.get("published_at"), now)),
            ("replays", Text(str(c.get("replay_count") or 0))),
            ("last replayed", _when(c.get("last_replayed_at"), now)),
            ("locked by", Text(str(c.get("locked_by") or "—"))),
            (
                "locked until",
                Text.assemble(_when(locked_until, now), (lease_state, "#ffaf5f")),
            ),
            ("claim version", Text(str(c.get("claim_version")))),
        ]
    )
    errors = _grid(
        [
            (
                "last error",
                Text(
                    str(c.get("last_error") or "—"),
                    style=ERROR if c.get("last_error") else MUTED_STYLE,
                ),
            ),
            (
                "dead-letter reason",
                Text(
                    str(c.get("dead_letter_reason") or "—"),
                    style=ERROR if c.get("dead_letter_reason") else MUTED_STYLE,
                ),
            ),
        ]
    )
    payload: RenderableType
    if detail.payload_error:
        payload = Group(
            Text(detail.payload_error, style=ERROR), Text(one_line(detail.payload, 2000))
        )
    else:
        payload = JSON.from_data(detail.payload, indent=2, sort_keys=True)
    parts: list[RenderableType] = [
        title,
        _section("Event"),
        identity,
        _section("Errors"),
        errors,
        _section("Delivery and lease"),
        delivery,
        _section("Payload"),
        payload,
        _section(f"Replay history ({len(detail.replays)})"),
        _records(
            detail.replays,
            (
                ("replayed_at", "when"),
                ("operator", "operator"),
                ("reason", "reason"),
                ("previous_attempt_count", "attempts"),
                ("cleared_dead_letter_reason", "cleared reason"),
            ),
            now,
        ),
        _section(f"Handler runs ({len(detail.handler_runs)})"),
        _records(
            detail.handler_runs,
            (
                ("handler_key", "handler"),
                ("status", "status"),
                ("attempt_count", "tries"),
                ("updated_at", "when"),
                ("last_error", "last error"),
            ),
            now,
        ),
        _section(f"Side effects ({len(detail.side_effects)})"),
        _records(
            detail.side_effects,
            (
                ("handler_key", "handler"),
                ("effect_key", "effect"),
                ("status", "status"),
                ("attempt_count", "tries"),
                ("response", "response"),
                ("last_error", "last error"),
            ),
            now,
        ),
    ]
    return Group(*parts)


class EventDetailPane(VerticalScroll):
    """A scrollable pane beside the table; follows the highlighted row while open."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.event_id: str | None = None
        self.border_title = "Event detail"

    def compose(self):  # type: ignore[no-untyped-def]
        yield Static(Text("Loading…", style=MUTED_STYLE), id="detail-body")

    def show(self, detail: EventDetail, now: datetime) -> None:
        new_event = detail.columns.get("id") != self.event_id
        self.event_id = str(detail.columns.get("id"))
        status = str(detail.columns.get("status", ""))
        self.border_subtitle = status.replace("_", " ")
        self.query_one("#detail-body", Static).update(render_detail(detail, now))
        if new_event:
            self.scroll_home(animate=False)

    def show_message(self, message: str, *, error: bool = False) -> None:
        self.query_one("#detail-body", Static).update(
            Text(message, style=ERROR if error else MUTED_STYLE)
        )
