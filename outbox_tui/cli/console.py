"""``outbox-tui`` without a subcommand: the console (``--demo`` for a demo database)."""

from __future__ import annotations

import argparse

from engine.settings import ConsoleSettings, ConsumerSettings, OutboxSettings
from outbox_tui.cli.options import Invocation, add_bindings, add_broker, add_settings


def add_options(parser: argparse.ArgumentParser) -> None:
    """The console's options live on the root parser: it runs when no command is given."""
    group = parser.add_argument_group("console (no subcommand)")
    group.add_argument(
        "--demo",
        action="store_true",
        default=argparse.SUPPRESS,
        help="run the console on a demo database with generated traffic",
    )
    add_settings(group, ConsoleSettings)
    # The console's replay dialogs warn about events older than the consumers' window.
    add_settings(group, OutboxSettings, ("dedup_window_seconds",))
    add_broker(parser)
    # The catalog (c) says what the inbox receives: its queue and bindings, as consume's.
    inbox = parser.add_argument_group("the inbox the catalog shows (as consume takes it)")
    add_settings(inbox, ConsumerSettings, ("queue",))
    add_bindings(inbox)


def console(inv: Invocation) -> int:
    from outbox_tui.console import run_console

    return run_console(
        inv.settings,
        installed_apps=list(inv.installed_apps),
        app_dir=inv.app_dir,
        demo=bool(inv.opt("demo")),
        stderr=inv.out.stderr,
    )
