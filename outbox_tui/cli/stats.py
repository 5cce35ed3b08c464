"""``outbox-tui stats``: counts, ages and heartbeats from the insights the console shows."""

from __future__ import annotations

from typing import Any

from engine.operating.retention import inbound_window
from engine.service import insights_for, open_database, paused_backlog
from engine.settings import DispatcherSettings
from outbox_tui import PROG, output
from outbox_tui.cli.errors import EXIT_OK
from outbox_tui.cli.options import Invocation, add_json, add_settings, subparser


def register(sub: Any) -> None:
    p = subparser(
        sub,
        "stats",
        "counts, ages and dispatcher and consumer heartbeats",
        "Counts per status, the oldest pending event's age, events stuck in publishing "
        "with an expired lease, published events awaiting the retention purge, the inbound "
        "events the inbox remembers and its dedup window, and every dispatcher's and inbox "
        "consumer's heartbeat, the active pauses (with how many events each holds back) "
        "and the event types with the most undelivered events, by status.",
        f"{PROG} stats",
        f"{PROG} stats --retention-seconds 86400 --json",
        f"{PROG} stats --retention-seconds none  # do not count the purge backlog",
    )
    add_settings(p, DispatcherSettings, ("retention_seconds", "inbound_retention_seconds"))
    add_json(p, "print one JSON object")
    p.set_defaults(run=stats)


async def stats(inv: Invocation) -> int:
    async with open_database(inv.database_url, "command") as engine:
        dispatcher: DispatcherSettings | None = inv.settings.dispatcher
        if inv.settings_problem:
            # A read-only look during an incident must not fail on a dispatcher setting.
            inv.out.note(f"purge backlog not counted: {inv.settings_problem}")
            dispatcher = None
        insights = insights_for(engine, dispatcher)
        snapshot = await insights.overview()
        pauses = await paused_backlog(engine)
        top = await insights.top_types()
    window = inbound_window(dispatcher.inbound_retention_seconds if dispatcher else None)
    if inv.json:
        record = output.stats_record(
            snapshot, inv.masked_url, pauses=pauses, top_types=top, inbound_retention_seconds=window
        )
        inv.out.json(record)
    else:
        tables = output.stats_tables(
            snapshot,
            inv.masked_url,
            pauses=pauses,
            top_types=top,
            width=inv.out.console.width,
            inbound_retention_seconds=window,
        )
        for table in tables:
            inv.out.console.print(table)
    return EXIT_OK
