"""``outbox-tui event ID``: one event, as the console's detail shows it, or as JSON."""

from __future__ import annotations

from typing import Any

from engine.clock import utc_now
from engine.service import insights_for, open_database
from outbox_tui import PROG, output
from outbox_tui.cli.errors import EXIT_OK
from outbox_tui.cli.options import Invocation, add_json, subparser
from outbox_tui.widgets.event_detail import render_detail


def register(sub: Any) -> None:
    p = subparser(
        sub,
        "event",
        "one event: its columns, payload, chain, handler runs and side effects",
        "Show one outbox event as the console's detail pane does: its columns and lease, "
        "errors, payload, replays and skips, handler runs and side effects, and its chain: "
        "the event whose handler published it (causation_id), the first event of its chain "
        "(correlation_id), and every event of that chain in write order.",
        f"{PROG} event 0190a8e0-0000-7000-8000-000000000001",
        f"{PROG} event 0190a8e0-0000-7000-8000-000000000001 --json",
    )
    p.add_argument("event_id", metavar="EVENT_ID", help="the event's id")
    add_json(p, "print one JSON object")
    p.set_defaults(run=show_event)


async def show_event(inv: Invocation) -> int:
    async with open_database(inv.database_url, "command") as engine:
        detail = await insights_for(engine).event_detail(inv.args.event_id)
    if inv.json:
        inv.out.json(output.event_detail_record(detail))
    else:
        link = inv.settings.console.trace_url_template  # OUTBOX_CONSOLE__TRACE_URL_TEMPLATE
        inv.out.console.print(render_detail(detail, utc_now(), trace_url_template=link))
    return EXIT_OK
