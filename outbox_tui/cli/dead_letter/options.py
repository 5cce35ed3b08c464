"""The options the dead-letter actions share: the ``--tenant``/``--event-type`` filter
(list, replay) and, for the audited actions (replay, skip), the event id,
``--dry-run``/``--yes``/``--reason``/``--operator`` and the confirmation rule."""

from __future__ import annotations

import argparse

from outbox_tui.cli.errors import UsageError
from outbox_tui.cli.options import add_json, text_of_at_most

# Not empty; as long as SQLite lets a plain-SQL producer make one (PostgreSQL: 36).
EVENT_ID = text_of_at_most(4096)


def add_audited_action(parser: argparse.ArgumentParser, action: str, dry_run: str) -> None:
    """The options every audited operator action has: dry run, confirmation, who and why."""
    parser.add_argument("--dry-run", action="store_true", help=dry_run)
    parser.add_argument("--yes", action="store_true", help=f"confirm the {action} (required)")
    parser.add_argument("--reason", metavar="TEXT", help="why (stored in the audit log)")
    parser.add_argument(
        "--operator", metavar="NAME", help="who (stored in the audit log; default: the OS user)"
    )
    add_json(parser, "print one JSON object")


def add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", metavar="T", help="only this tenant_id")
    parser.add_argument("--event-type", metavar="E", help="only this event type")


def confirmed(args: argparse.Namespace, action: str, only: str) -> None:
    if not args.dry_run and not args.yes:
        raise UsageError(
            f"refusing to {action} without confirmation: add --yes (or --dry-run to only {only})"
        )
