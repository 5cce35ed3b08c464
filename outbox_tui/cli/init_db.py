"""``outbox-tui init-db``: create or upgrade the outbox tables (idempotent)."""

from __future__ import annotations

from typing import Any

from engine.errors import SchemaMissingError, SchemaOutdatedError
from engine.service import open_database
from engine.service.database import require_database_file, sqlite_path
from engine.storage.database import check_schema, create_schema
from engine.storage.migrations import new_schema_sql, schema_statements
from outbox_tui import PROG
from outbox_tui.cli.errors import EXIT_FAILURE, EXIT_OK
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
        f"{PROG} init-db --check    # exit 1 unless the tables are current",
        f"{PROG} init-db --sql > outbox_upgrade.sql    # for your own migration tool",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help="only tell whether the outbox tables are current (exit 0) or not (exit 1); "
        "changes nothing",
    )
    mode.add_argument(
        "--sql",
        action="store_true",
        help="print the SQL init-db would run on this database (nothing when it is "
        "current) instead of running it",
    )
    add_json(p, "print one JSON object")
    p.set_defaults(run=init_db)


async def init_db(inv: Invocation) -> int:
    if inv.args.check:
        return await _check(inv)
    if inv.args.sql:
        return await _sql(inv)
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


async def _check(inv: Invocation) -> int:
    """The schema's state, changing nothing: current (0), missing or outdated (1).

    Current means init-db would run nothing: every table, column, index and collation of
    this version is there (``check_schema`` refuses a database for less).
    """
    try:
        require_database_file(inv.database_url)
        async with open_database(inv.database_url, "command", need_schema=False) as engine:
            await check_schema(engine)
            pending = await schema_statements(engine)
        if pending:
            raise SchemaOutdatedError(
                f"the outbox tables lack {len(pending)} statement(s) of this version "
                f"(`{PROG} init-db --sql` prints them); upgrade them with `{PROG} init-db`"
            )
    except (SchemaMissingError, SchemaOutdatedError) as exc:
        if not inv.json:
            raise
        state = "missing" if isinstance(exc, SchemaMissingError) else "outdated"
        inv.out.json({"database_url": inv.masked_url, "schema": state, "detail": str(exc)})
        return EXIT_FAILURE
    if inv.json:
        inv.out.json({"database_url": inv.masked_url, "schema": "current", "detail": None})
    else:
        inv.out.say(f"the outbox schema at {inv.masked_url} is current")
    return EXIT_OK


async def _sql(inv: Invocation) -> int:
    """What init-db would run, as SQL, changing nothing (a SQLite file is not created)."""
    path = sqlite_path(inv.database_url)
    if path is not None and not path.exists():
        statements = new_schema_sql(inv.database_url)
    else:
        async with open_database(inv.database_url, "command", need_schema=False) as engine:
            statements = await schema_statements(engine)
    if inv.json:
        inv.out.json({"database_url": inv.masked_url, "statements": statements})
    elif statements:
        for statement in statements:
            inv.out.say(f"{statement};")
    else:
        inv.out.say(f"-- the outbox schema at {inv.masked_url} is current: nothing to run")
    return EXIT_OK
