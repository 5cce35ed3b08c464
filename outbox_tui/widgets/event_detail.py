"""Everything about one event: columns, lease, errors, payload, replays, handler records."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.json import JSON
from rich.rule import Rule
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from engine.operating.insights import EventDetail
from engine.storage.schema import DEAD_LETTER, PUBLISHED
from outbox_tui.safe_text import printable
from outbox_tui.widgets.event_trace import trace_rows
from outbox_tui.widgets.format import (
    MUTED_STYLE,
    one_line,
    relative,
    short_id,
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


def _status(value: Any) -> Text:
    ok = value == "succeeded"
    return Text(str(value), style="#87d787" if ok else ERROR)


def _tries(value: Any) -> str:
    return f"{value} {'try' if value == 1 else 'tries'}"


def _compact(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(", ", ": "), default=str)
    except (TypeError, ValueError):
        return str(value)


def _lines(rows: Sequence[Text]) -> RenderableType:
    if not rows:
        return Text("none", style=MUTED_STYLE)
    return Group(*rows)


def _replay_lines(replays: Sequence[Mapping[str, Any]], now: datetime) -> RenderableType:
    rows = []
    for r in replays:
        action = "skipped" if r.get("action") == "skip" else "replayed"
        line = Text.assemble(
            _when(r.get("replayed_at"), now),
            "  ",
            (action, "#ffaf5f" if action == "skipped" else ""),
            " by ",
            (str(r.get("operator")), "bold"),
        )
        line.append(f": {r['reason']}" if r.get("reason") else ": (no reason given)")
        cleared = r.get("cleared_dead_letter_reason")
        line.append(
            f"\n   after {_tries(r.get('previous_attempt_count'))}; cleared: "
            f"{one_line(cleared, 300) if cleared else '—'}",
            style=MUTED_STYLE,
        )
        rows.append(line)
    return _lines(rows)


def _run_lines(runs: Sequence[Mapping[str, Any]], now: datetime) -> RenderableType:
    rows = []
    for r in runs:
        line = Text.assemble(
            (str(r.get("handler_key")), "bold"),
            "  ",
            _status(r.get("status")),
            f"  {_tries(r.get('attempt_count'))}  ",
            (relative(r.get("updated_at"), now), MUTED_STYLE),
        )
        if r.get("last_error"):
            line.append(f"\n   {one_line(r['last_error'], 300)}", style=ERROR)
        rows.append(line)
    return _lines(rows)


def _effect_lines(effects: Sequence[Mapping[str, Any]], now: datetime) -> RenderableType:
    rows = []
    for e in effects:
        line = Text.assemble(
            (str(e.get("handler_key")), "bold"),
            " → ",
            (str(e.get("effect_key")), "bold"),
            "  ",
            _status(e.get("status")),
            f"  {_tries(e.get('attempt_count'))}",
        )
        if e.get("last_error"):
            line.append(f"\n   {one_line(e['last_error'], 300)}", style=ERROR)
        elif e.get("response") is not None:
            line.append(
                f"\n   response {one_line(_compact(e['response']), 300)}", style=MUTED_STYLE
            )
        rows.append(line)
    return _lines(rows)


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _ordering_rows(
    detail: EventDetail, now: datetime, waiting: int | None
) -> list[tuple[str, RenderableType]]:
    """Its ordering key, where it stands in the key, and what waits behind it."""
    c = detail.columns
    key = c.get("ordering_key")
    if key is None:
        return [("ordering key", Text("none (unordered)", style=MUTED_STYLE))]
    rows: list[tuple[str, RenderableType]] = [("ordering key", Text(str(key), style="bold"))]
    status = c.get("status")
    earlier = detail.earlier_in_key
    if status != PUBLISHED and earlier is not None:
        if earlier == 0:
            position = Text("none: it is the head of its key")
        else:
            position = Text.assemble(
                (_plural(earlier, "undelivered event"), "bold #ffaf5f"),
                " of its key " + ("comes" if earlier == 1 else "come") + " first",
            )
        rows.append(("earlier in key", position))
    if waiting is not None:
        held = status == DEAD_LETTER and c.get("skipped_at") is None
        blocks = held or status == "failed"
        line = Text(_plural(waiting, "event"), style="bold #ffaf5f" if waiting else "")
        if blocks:
            line.append(" waits behind it" if waiting == 1 else " wait behind it", style="")
            if held:
                line.append("  k skips it, r replays it", style=MUTED_STYLE)
        else:
            line.append(" of its key " + ("comes" if waiting == 1 else "come") + " after it")
        rows.append(("waiting behind", line))
    if c.get("skipped_at") is not None:
        rows.append(
            (
                "skipped",
                Text.assemble(_when(c.get("skipped_at"), now), ("  its key went on", MUTED_STYLE)),
            )
        )
    return rows


def _cause_rows(c: Mapping[str, Any]) -> list[tuple[str, RenderableType]]:
    """What caused it, for an event a handler published (a first event has none)."""
    if c.get("causation_id") is None:
        return []
    return [
        ("caused by", Text(str(c["causation_id"]))),
        (
            "first in chain",
            Text(str(c.get("correlation_id") or c["causation_id"]), style=MUTED_STYLE),
        ),
    ]


def _chain_lines(detail: EventDetail) -> RenderableType:
    """The events of its chain in write order, each indented under the event that caused
    it; this event marked. Ids are cut as in the table, so a line fits the pane; the
    cause's full id is in the lines above."""
    this = detail.columns.get("id")
    depth: dict[Any, int] = {}
    rows = []
    for link in detail.chain:
        level = depth.get(link.get("causation_id"), -1) + 1
        depth[link.get("id")] = level
        line = Text("  " * level + ("└ " if level else ""), style=MUTED_STYLE)
        line.append_text(status_text(str(link.get("status", ""))))
        line.append(f"  {printable(str(link.get('event_type')))}  ")
        line.append(short_id(str(link.get("id"))), style=MUTED_STYLE)
        if link.get("id") == this:
            line.append("  ◀ this event", style="bold")
        rows.append(line)
    return _lines(rows)


# How much of an undecodable message's raw body the detail shows.
RAW_BODY_SHOWN = 400


def _origin_rows(c: Mapping[str, Any]) -> list[tuple[str, RenderableType]]:
    """Where an inbound event (engine.inbox) came from; empty for a local one."""
    if c.get("inbound_queue") is None:
        return []
    rows: list[tuple[str, RenderableType]] = [
        ("received from", Text.assemble("queue ", (str(c["inbound_queue"]), "bold"))),
        ("source", Text(str(c.get("inbound_source") or "— (not read)"))),
        ("CloudEvents id", Text(str(c.get("inbound_id") or "— (not read)"))),
    ]
    attributes = c.get("inbound_attributes")
    if isinstance(attributes, Mapping):
        for name in ("subject", "time", "dataschema", "datacontenttype"):
            if attributes.get(name) is not None:
                rows.append((name, Text(printable(str(attributes[name])))))
        rest = {
            k: v
            for k, v in attributes.items()
            if k not in ("subject", "time", "dataschema", "datacontenttype", "specversion")
        }
        if rest:
            rows.append(("extensions", Text(printable(one_line(_compact(rest), 400)))))
    for name in ("traceparent", "tracestate"):
        if c.get(name):
            rows.append((name, Text(str(c[name]))))
    body = c.get("inbound_body")
    if isinstance(body, bytes | bytearray | memoryview):
        raw = bytes(body)
        shown = raw[:RAW_BODY_SHOWN].decode("utf-8", "backslashreplace")
        more = f" … ({len(raw):,} bytes)" if len(raw) > RAW_BODY_SHOWN else f" ({len(raw):,} bytes)"
        rows.append(("raw body", Text.assemble(printable(shown), (more, MUTED_STYLE))))
    return rows


def _payload_tree(payload: Any) -> RenderableType:
    """The decoded payload as an indented JSON tree.

    Indenting runs json's Python encoder, a few frames per level: a payload that decoded
    (the stored one may nest hundreds of levels deep) could still pass the recursion
    limit here, on the console's deeper stack, and must not take the console down.
    """
    try:
        return JSON.from_data(payload, indent=2, sort_keys=True)
    except RecursionError:
        return Text("payload nested too deeply to show as a tree", style=ERROR)


def render_detail(
    detail: EventDetail,
    now: datetime,
    *,
    waiting: int | None = None,
    trace_url_template: str | None = None,
) -> RenderableType:
    """The whole detail as one Rich renderable (also used by tests to read it as text).

    ``waiting``: the events of its ordering key behind it, when the caller counted them;
    ``trace_url_template``: where an operator opens the event's trace (``{trace_id}``).
    """
    # Stored text (producers', handlers' and outside systems') shown, never sent as control.
    c: dict[str, Any] = {  # as loosely typed as ``EventDetail.columns``, a row's mapping
        k: printable(v) if isinstance(v, str) else v for k, v in detail.columns.items()
    }
    status = str(c.get("status", ""))
    title = Text.assemble(status_text(status), "  ", (str(c.get("id", "")), "bold"))
    identity = _grid(
        [
            ("type", Text(f"{c.get('event_type')} v{c.get('event_version')}")),
            ("tenant", Text(str(c.get("tenant_id")))),
            ("aggregate", Text(f"{c.get('aggregate_type')}:{c.get('aggregate_id')}")),
            *_ordering_rows(detail, now, waiting),
            *_cause_rows(c),
            *trace_rows(detail, trace_url_template),
            ("created", _when(c.get("created_at"), now)),
        ]
    )
    locked_by, locked_until = c.get("locked_by"), c.get("locked_until")
    if locked_until is None:
        lease = Text("not held", style=MUTED_STYLE)
    else:
        expired = locked_until < now
        lease = Text.assemble(
            str(locked_by or "?"),
            " until ",
            _when(locked_until, now),
            ("  expired" if expired else "  held", "#ffaf5f" if expired else MUTED_STYLE),
        )
    replays = Text(str(c.get("replay_count") or 0))
    if c.get("last_replayed_at") is not None:
        replays.append("  last ")
        replays.append_text(_when(c.get("last_replayed_at"), now))
    delivery = _grid(
        [
            ("attempts", Text(f"{c.get('attempt_count')} of {c.get('max_attempts')}")),
            ("next retry", _when(c.get("next_retry_at"), now)),
            ("published", _when(c.get("published_at"), now)),
            ("replays", replays),
            ("lease", lease),
            ("claim version", Text(str(c.get("claim_version")))),
        ]
    )
    problems = [
        (label, Text(str(c.get(key)), style=ERROR))
        for key, label in (
            ("last_error", "last error"),
            ("dead_letter_reason", "dead-letter reason"),
        )
        if c.get(key)
    ]
    errors: RenderableType = _grid(problems) if problems else Text("none", style=MUTED_STYLE)
    payload: RenderableType
    if detail.payload_error:
        payload = Group(
            Text(printable(detail.payload_error), style=ERROR),
            Text(one_line(detail.payload, 2000)),
        )
    else:
        payload = _payload_tree(detail.payload)
    chain: list[RenderableType] = []
    if len(detail.chain) > 1:  # it caused events, or an event caused it
        chain = [_section(f"Chain ({len(detail.chain)} events)"), _chain_lines(detail)]
    origin_rows = _origin_rows(c)
    origin: list[RenderableType] = []
    if origin_rows:
        origin = [_section("Origin (inbound)"), _grid(origin_rows)]
    parts: list[RenderableType] = [
        title,
        _section("Event"),
        identity,
        *origin,
        *chain,
        _section("Errors"),
        errors,
        _section("Delivery and lease"),
        delivery,
        _section(f"Replays and skips ({len(detail.replays)})"),
        _replay_lines(detail.replays, now),
        _section(f"Handler runs ({len(detail.handler_runs)})"),
        _run_lines(detail.handler_runs, now),
        _section(f"Side effects ({len(detail.side_effects)})"),
        _effect_lines(detail.side_effects, now),
        _section("Payload"),
        payload,
    ]
    return Group(*parts)


class EventDetailPane(VerticalScroll):
    """A scrollable pane beside the table; follows the highlighted row while open."""

    def __init__(self, *, trace_url_template: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trace_url_template = trace_url_template
        self.event_id: str | None = None
        self.detail: EventDetail | None = None  # what is shown, for tests and screenshots
        self.waiting: int | None = None
        self.border_title = "Event detail · esc closes"

    def compose(self) -> ComposeResult:
        yield Static(Text("Loading…", style=MUTED_STYLE), id="detail-body")

    def show(self, detail: EventDetail, now: datetime, *, waiting: int | None = None) -> None:
        new_event = detail.columns.get("id") != self.event_id
        self.event_id = str(detail.columns.get("id"))
        self.detail, self.waiting = detail, waiting
        status = str(detail.columns.get("status", ""))
        self.border_subtitle = status.replace("_", " ")
        body = render_detail(
            detail, now, waiting=waiting, trace_url_template=self.trace_url_template
        )
        self.query_one("#detail-body", Static).update(body)
        if new_event:
            self.scroll_home(animate=False)

    def show_message(self, message: str, *, error: bool = False) -> None:
        self.query_one("#detail-body", Static).update(
            Text(message, style=ERROR if error else MUTED_STYLE)
        )
