"""``outbox-tui`` without a subcommand: check the database, then open the console.

Start-up problems (a bad URL, an unreachable database, missing tables, a broken
installed app) are one line on stderr with how to fix it, and exit status 1;
never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from textual.logging import TextualHandler

from engine.database import (
    DEFAULT_DATABASE_URL,
    check_schema,
    mask_secrets,
    mask_url,
    parse_database_url,
)
from engine.errors import (
    DatabaseUnavailableError,
    OutboxError,
    SchemaMissingError,
    SchemaOutdatedError,
)
from outbox_tui.app import ConsoleConfig, OutboxConsole, console_engine, make_app
from outbox_tui.apps import load_registry
from outbox_tui.demo import DEMO_APPS, DEMO_DATABASE_URL, DemoTraffic, prepare_demo_database
from outbox_tui.sqlite_workers import settle_sqlite_workers

PROG = "outbox-tui"
PREFLIGHT_TIMEOUT_SECONDS = 20.0


class StartupError(OutboxError):
    """The console cannot open: the message says why and what to do."""


def _sqlite_path(database_url: str) -> Path | None:
    url = parse_database_url(database_url)
    if url.get_backend_name() != "sqlite":
        return None
    return Path(url.database or "").absolute()


def missing_sqlite_file(database_url: str) -> Path | None:
    """The absolute path of a SQLite URL's file when that file does not exist."""
    path = _sqlite_path(database_url)
    return None if path is None or path.exists() else path


async def preflight(database_url: str) -> None:
    """Raise a one-line ``OutboxError`` unless the outbox tables answer at ``database_url``."""
    masked = mask_url(database_url)
    missing = missing_sqlite_file(database_url)
    if missing is not None:
        raise StartupError(
            f"no SQLite database at {missing}; create it with "
            f"`{PROG} init-db --database-url {masked}`"
        )
    sqlite_path = _sqlite_path(database_url)
    if sqlite_path is not None and sqlite_path.is_dir():
        # Said plainly rather than as the driver's "unable to open database file".
        raise StartupError(f"{sqlite_path} is a directory, not a SQLite database file")
    engine = console_engine(database_url)
    try:
        async with asyncio.timeout(PREFLIGHT_TIMEOUT_SECONDS):
            await check_schema(engine)
    except TimeoutError:
        raise StartupError(
            f"the database at {masked} did not answer within {PREFLIGHT_TIMEOUT_SECONDS:g}s; "
            "check that it is running and reachable"
        ) from None
    except SchemaMissingError:
        raise StartupError(
            f"the outbox tables are missing in {masked}; create them with "
            f"`{PROG} init-db --database-url {masked}`"
        ) from None
    except SchemaOutdatedError:
        raise StartupError(
            f"the outbox tables in {masked} are from an earlier version; upgrade them in "
            f"place with `{PROG} init-db --database-url {masked}`"
        ) from None
    except DatabaseUnavailableError as exc:
        raise StartupError(
            f"{exc}; check that the database is running and the URL is right"
        ) from None
    finally:
        await engine.dispose()
        await settle_sqlite_workers()


def prepare_console(
    *,
    database_url: str,
    installed_apps: list[str],
    amqp_url: str | None,
    exchange: str | None,
    refresh_seconds: float,
    demo: bool,
) -> OutboxConsole:
    """Everything before the screen switches: apps, demo database, preflight, the app.

    Raises a one-line ``OutboxError`` for anything the operator has to fix. Runs its
    own event loop, so call it outside one (or in a thread).
    """
    traffic = None
    if demo:
        if not database_url or database_url == DEFAULT_DATABASE_URL:
            database_url = DEMO_DATABASE_URL
        installed_apps = list(dict.fromkeys([*DEMO_APPS, *installed_apps]))
        registry = load_registry(installed_apps)
        asyncio.run(prepare_demo_database(database_url, registry))
        traffic = DemoTraffic(database_url, registry)
    else:
        registry = load_registry(installed_apps)
    asyncio.run(preflight(database_url))
    config = ConsoleConfig(
        database_url=database_url,
        installed_apps=tuple(installed_apps),
        amqp_url=amqp_url,
        exchange=exchange,
        refresh_seconds=refresh_seconds,
        autostart_dispatch=demo,
    )
    return make_app(config, registry=registry, traffic=traffic)


@contextlib.contextmanager
def logging_into_console() -> Iterator[None]:
    """While the console owns the terminal, log records go to Textual, not to stderr.

    A handler writing to the terminal (the CLI installs one) would tear the screen.
    """
    root = logging.getLogger()
    saved = list(root.handlers)
    for handler in saved:
        root.removeHandler(handler)
    root.addHandler(TextualHandler())
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved:
            root.addHandler(handler)


def run_console(
    *,
    database_url: str,
    installed_apps: list[str],
    amqp_url: str | None,
    exchange: str,
    refresh_seconds: float,
    demo: bool,
    stderr: TextIO | None = None,
) -> int:
    """Open the console; returns the exit status (1 with one line on stderr on failure)."""
    err = stderr or sys.stderr
    try:
        app = prepare_console(
            database_url=database_url,
            installed_apps=installed_apps,
            amqp_url=amqp_url,
            exchange=exchange,
            refresh_seconds=refresh_seconds,
            demo=demo,
        )
    except OutboxError as exc:
        message = mask_secrets(" ".join(str(exc).split()), database_url, amqp_url or "")
        print(f"{PROG}: error: {message}", file=err)
        return 1
    with logging_into_console():
        app.run()
    return app.return_code or 0
