"""``dead-letter list`` (dead letters, newest first) and ``dead-letter groups`` (failed
rows and dead letters grouped by error fingerprint, for ``replay --group``)."""

from __future__ import annotations

import argparse
from typing import Any

from engine.operating.error_groups import DEFAULT_SCAN_LIMIT
from engine.service import error_groups, insights_for, open_database
from outbox_tui import PROG, output
from outbox_tui.cli.dead_letter.options import add_filters
from outbox_tui.cli.errors import EXIT_OK
from outbox_tui.cli.options import Invocation, add_json, positive_int, subparser


def register_list(inner: Any) -> None:
    lst = subparser(
        inner,
        "list",
        "list dead letters, newest first",
        "List dead-letter events, newest first.",
        f"{PROG} dead-letter list",
        f"{PROG} dead-letter list --tenant acme --event-type orders.placed --limit 20 --json",
    )
    add_filters(lst)
    lst.add_argument(
        "--limit",
        metavar="N",
        type=positive_int,
        default=100,
        help="at most N events (default 100)",
    )
    add_json(lst, "print a JSON list")
    lst.set_defaults(run=list_dead_letters)


def register_groups(inner: Any) -> None:
    grp = subparser(
        inner,
        "groups",
        "failed rows and dead letters grouped by error fingerprint",
        "Group failed rows and dead letters by their error with ids, numbers, UUIDs, times "
        "and quoted values normalised away: which failures are the same failure. Largest "
        "group first, each with its fingerprint (for replay --group), count, statuses, "
        "event types, tenants and first and last seen. Reads the newest --scan-limit rows "
        "and says when it stopped short.",
        f"{PROG} dead-letter groups",
        f"{PROG} dead-letter groups --json",
        f"{PROG} dead-letter groups --scan-limit 100000",
    )
    grp.add_argument(
        "--scan-limit",
        metavar="N",
        type=positive_int,
        default=DEFAULT_SCAN_LIMIT,
        help=f"read at most N rows, newest first (default {DEFAULT_SCAN_LIMIT:,})",
    )
    add_json(grp, "print one JSON object")
    grp.set_defaults(run=list_groups)


async def list_dead_letters(inv: Invocation) -> int:
    args = inv.args
    async with open_database(inv.database_url, "command") as engine:
        page = await insights_for(engine).dead_letters(
            tenant_id=args.tenant, event_type=args.event_type, limit=args.limit
        )
    if inv.json:
        inv.out.json([output.dead_letter_record(e) for e in page.events])
    elif not page.events:
        inv.out.say("no dead letters" + _filter_note(args))
    else:
        inv.out.console.print(
            output.dead_letters_table(
                page.events, has_more=page.has_more, width=inv.out.console.width
            )
        )
    return EXIT_OK


def _filter_note(args: argparse.Namespace) -> str:
    parts = [f"tenant={args.tenant}" if args.tenant else "", args.event_type or ""]
    text = " ".join(p for p in parts if p)
    return f" matching {text}" if text else ""


async def list_groups(inv: Invocation) -> int:
    async with open_database(inv.database_url, "command") as engine:
        found = await error_groups(engine, scan_limit=inv.args.scan_limit)
    if inv.json:
        inv.out.json(output.error_groups_record(found))
        return EXIT_OK
    if not found.complete:
        inv.out.note(
            f"scan incomplete: read the newest {found.scanned} rows only "
            "(raise --scan-limit to read more)"
        )
    if not found.groups:
        inv.out.say("no failed events or dead letters")
    else:
        inv.out.console.print(output.error_groups_table(found, width=inv.out.console.width))
    return EXIT_OK
