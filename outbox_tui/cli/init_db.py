"""``outbox-tui init-db``: create or upgrade the outbox tables (idempotent)."""

from __future__ import annotations

from typing import Any

from engine.errors import SchemaMissingError, SchemaOutdatedError
from engine.service import open_database
from engine.storage.database import check_schema, create_schema
from outbox_tui import PROG
from outbox_tui.cli.errors import EXIT_OK
from outbox_tui.cli.options import Invocation, add_json, subparser


def register(sub: Any) -> None:
    p = subparser(
        sub,
        "init-db",
        "create or upgrade the outbox tables (idempotent)",
        "Create the outbox tables and indexes if they do not exist, or upgrade tables an "
        "earlier version made in place (new columns, indexes). Safe to run again.",
        f"{PROG} init-db",
        f"{PROG} init-db --database-url postgresql+asyncpg://app:secret@db/app --json",
    )
    add_json(p, "print one JSON object")
    p.set_defaults(run=init_db)


async def init_db(inv: Invocation) -> int:
    async with open_database(inv.database_url, "command", need_schema=False) as engine:
        try:
            await check_schema(engine)
            before = "present"
        except SchemaMissingError:
            before = "created"
        except SchemaOutdatedError:
            before = "upgraded"
        steps = await create_schema(engine)
    # Steps on a database that looked current (an index it lacked) are an upgrade too.
    schema = "upgraded" if steps else before
    record = {"database_url": inv.masked_url, "schema": schema, "upgrade_steps": list(steps)}
    if inv.json:
        inv.out.json(record)
    elif schema == "upgraded":
        inv.out.say(f"upgraded the outbox schema at {inv.masked_url} in place:")
        for step in steps:
            inv.out.say(f"  {step}")
    elif schema == "present":
        inv.out.say(f"the outbox schema is already present at {inv.masked_url} (checked)")
    else:
        inv.out.say(f"created the outbox schema at {inv.masked_url}")
    return EXIT_OK
