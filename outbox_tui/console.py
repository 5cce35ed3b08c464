"""``outbox-tui`` without a subcommand: check the database, then open the console.

Start-up problems (a bad URL, an unreachable database, missing tables, a broken
installed app) are one line on stderr with how to fix it, never a traceback; the exit
status is the CLI's: 2 when the invocation or configuration must change, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import TextIO

from textual.logging import TextualHandler

from engine.errors import OutboxError
from engine.service import (
    check_database,
    dispose,
    load_registry,
    open_engine,
    require_database_file,
)
from engine.settings import OutboxSettings
from engine.storage.database import DEFAULT_DATABASE_URL
from engine.storage.secrets import mask_secrets
from outbox_tui import PROG
from outbox_tui.app import ConsoleConfig, OutboxConsole, make_app
from outbox_tui.cli.errors import EXIT_USAGE, exit_status
from outbox_tui.demo import (
    DEMO_APPS,
    DEMO_DATABASE_URL,
    DEMO_NOTE,
    DemoTraffic,
    prepare_demo_database,
)


async def preflight(database_url: str) -> None:
    """Raise a one-line ``OutboxError`` unless the outbox tables answer at ``database_url``."""
    require_database_file(database_url)
    engine = open_engine(database_url, "console")
    try:
        await check_database(engine)
    finally:
        await dispose(engine)


def prepare_console(
    settings: OutboxSettings,
    *,
    installed_apps: list[str],
    app_dir: str | None = None,
    demo: bool = False,
) -> OutboxConsole:
    """Everything before the screen switches: apps, demo database, preflight, the app.

    Raises a one-line ``OutboxError`` for anything the operator has to fix. Runs its
    own event loop, so call it outside one (or in a thread).
    """
    traffic = None
    database_url = settings.database_url
    if demo:
        if database_url == DEFAULT_DATABASE_URL:
            database_url = DEMO_DATABASE_URL
        installed_apps = list(dict.fromkeys([*DEMO_APPS, *installed_apps]))
        registry = load_registry(installed_apps, app_dir=app_dir)
        asyncio.run(prepare_demo_database(database_url, registry))
        traffic = DemoTraffic(database_url, registry)
    else:
        registry = load_registry(installed_apps, app_dir=app_dir)
    asyncio.run(preflight(database_url))
    config = ConsoleConfig(
        database_url=database_url,
        installed_apps=tuple(installed_apps),
        amqp_url=settings.amqp_url,
        exchange=settings.exchange,
        queue=settings.consumer.queue,
        bindings=settings.consumer.bindings,
        amqp_probe_seconds=settings.amqp_probe_seconds,
        amqp_max_probe_seconds=settings.amqp_max_probe_seconds,
        refresh_seconds=settings.console.refresh_seconds,
        page_size=settings.console.page_size,
        trace_url_template=settings.console.trace_url_template,
        autostart_dispatch=demo,
        dedup_window_seconds=settings.dedup_window_seconds,
        note=DEMO_NOTE if demo else (),
    )
    return make_app(
        config, registry=registry, traffic=traffic, dispatch_settings=settings.dispatcher
    )


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
    settings: OutboxSettings,
    *,
    installed_apps: list[str],
    app_dir: str | None = None,
    demo: bool = False,
    stderr: TextIO | None = None,
) -> int:
    """Open the console; returns the exit status (one line on stderr on failure)."""
    err = stderr or sys.stderr
    try:
        app = prepare_console(settings, installed_apps=installed_apps, app_dir=app_dir, demo=demo)
    except OutboxError as exc:
        urls = (settings.database_url, settings.amqp_url or "")
        message = mask_secrets(" ".join(str(exc).split()), *urls)
        print(f"{PROG}: error: {message}", file=err)
        return exit_status(exc)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        # Textual would draw into the pipe (escape codes, forever) and read no keys.
        print(
            f"{PROG}: error: the console needs a terminal (stdin and stdout are not one); "
            "in scripts use the commands: stats, dead-letter, dispatch (see --help)",
            file=err,
        )
        return EXIT_USAGE
    try:
        with logging_into_console():
            app.run()
    finally:
        if app.stop_signals is not None:
            app.stop_signals.restore()
    if app.stopped_by is not None:
        print(f"{PROG}: {app.stopped_by} received: the console stopped", file=err)
    return app.return_code or 0
