"""``outbox-tui pause|resume``: stop and restart delivery of one event type (audited).

A pause is stored in the database, so every dispatcher obeys it from its next
round: paused events stay pending, spend no attempts and are never dead-lettered.
Both commands change something, so both need ``--yes``; both write who and why
to the pause log (``engine.operating.pauses``).
"""

from __future__ import annotations

import argparse
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from engine.operating.pauses import Pause, describe_scope
from engine.operating.replay import default_operator
from engine.service import event_type_seen, open_database, pause_type, resume_type
from outbox_tui import PROG, output
from outbox_tui.cli.errors import EXIT_OK, UsageError
from outbox_tui.cli.options import Invocation, add_json, subparser


def register(sub: Any) -> None:
    pause = subparser(
        sub,
        "pause",
        "stop delivering one event type, for every tenant or one (audited)",
        "Pause delivery of an event type, for every tenant or for --tenant. Every "
        "dispatcher obeys it from its next round: paused events stay pending, spend no "
        "attempts and are never dead-lettered; events in flight finish. The pause is "
        "recorded with operator and reason; `stats` lists active pauses.",
        f"{PROG} pause --event-type orders.placed --reason 'CRM down' --yes",
        f"{PROG} pause --event-type orders.placed --tenant acme --reason 'acme migrating' --yes",
    )
    _add_scope(pause, "pause")
    pause.add_argument(
        "--reason", metavar="TEXT", required=True, help="why (required; stored in the audit log)"
    )
    pause.add_argument(
        "--force",
        action="store_true",
        help="pause a type that no installed app registers and no event in the outbox has "
        "(refused otherwise: likely a typo)",
    )
    pause.set_defaults(run=pause_command)
    resume = subparser(
        sub,
        "resume",
        "deliver a paused event type again (audited)",
        "End the pause of exactly this scope: resuming one tenant does not end a pause of "
        "every tenant, nor the reverse. The waiting events are delivered from the "
        "dispatchers' next round.",
        f"{PROG} resume --event-type orders.placed --yes",
        f"{PROG} resume --event-type orders.placed --tenant acme --yes --reason 'done'",
    )
    _add_scope(resume, "resume")
    resume.add_argument("--reason", metavar="TEXT", help="why (stored in the audit log)")
    resume.set_defaults(run=resume_command)


def _add_scope(parser: argparse.ArgumentParser, action: str) -> None:
    parser.add_argument("--event-type", metavar="T", required=True, help="the event type")
    parser.add_argument(
        "--tenant", metavar="X", help=f"only this tenant_id (default: {action} every tenant)"
    )
    parser.add_argument("--yes", action="store_true", help=f"confirm the {action} (required)")
    parser.add_argument(
        "--operator", metavar="NAME", help="who (stored in the audit log; default: the OS user)"
    )
    add_json(parser, "print one JSON object")


def _confirmed(inv: Invocation, action: str) -> None:
    if not inv.args.yes:
        scope = describe_scope(inv.args.event_type, inv.args.tenant)
        raise UsageError(f"refusing to {action} {scope} without confirmation: add --yes")


async def pause_command(inv: Invocation) -> int:
    _confirmed(inv, "pause")
    args = inv.args
    if not args.reason.strip():
        raise UsageError("--reason must not be empty: the next operator needs to know why")
    async with open_database(inv.database_url, "command") as engine:
        if not args.force:
            await _refuse_unknown(inv, engine, args.event_type)
        held = await pause_type(
            engine,
            args.event_type,
            args.tenant,
            reason=args.reason,
            operator=args.operator or default_operator(),
        )
    _report(inv, "paused", held)
    _note_if_unknown(inv, args.event_type)
    return EXIT_OK


async def _refuse_unknown(inv: Invocation, engine: AsyncEngine, event_type: str) -> None:
    """A type neither registered by the installed apps nor in the outbox is a typo until
    ``--force`` says otherwise: pausing it would hold nothing and exit 0."""
    if _registered(inv, event_type) or await event_type_seen(engine, event_type):
        return
    if inv.registry is not None:
        why, fix = "no installed app registers it and ", "add --force"
    else:
        why, fix = "", "name its app with --installed-app, or add --force"
    raise UsageError(
        f"refusing to pause {event_type!r}: {why}the outbox holds no event of that type "
        f"(a typo?); {fix} to pause it anyway"
    )


def _registered(inv: Invocation, event_type: str) -> bool:
    if inv.registry is None:
        return False
    return event_type in {name for name, _version in inv.registry.event_types()}


def _note_if_unknown(inv: Invocation, event_type: str) -> None:
    """A typo pauses nothing: say so when the installed apps do not register the type (the
    pause holds all the same: a dispatcher of another service may serve it)."""
    if inv.registry is None:
        return
    if not _registered(inv, event_type):
        inv.out.note(
            f"note: the installed apps register no event type {event_type!r}; check the "
            "name (the pause holds for any dispatcher that serves it)"
        )


async def resume_command(inv: Invocation) -> int:
    _confirmed(inv, "resume")
    args = inv.args
    operator = args.operator or default_operator()
    async with open_database(inv.database_url, "command") as engine:
        ended = await resume_type(
            engine, args.event_type, args.tenant, operator=operator, reason=args.reason
        )
    _report(inv, "resumed", ended, operator=operator, reason=args.reason)
    return EXIT_OK


def _report(
    inv: Invocation,
    action: str,
    held: Pause,
    *,
    operator: str | None = None,
    reason: str | None = None,
) -> None:
    """The pause made or ended; for a resume, who ended it and why, besides the pause."""
    record: dict[str, Any] = {
        "action": action,
        "event_type": held.event_type,
        "tenant_id": held.tenant_id,
        "paused_at": output.iso(held.paused_at),
        "paused_by": held.paused_by,
        "pause_reason": held.reason,
    }
    if action == "resumed":
        record.update(resumed_by=operator, reason=reason)
    if inv.json:
        inv.out.json(record)
    elif action == "paused":
        inv.out.say(
            f"paused {held.describe()} (operator {held.paused_by}, reason {held.reason!r}); "
            "dispatchers stop claiming it from their next round"
        )
    else:
        inv.out.say(
            f"resumed {held.describe()}, paused since {held.paused_at:%Y-%m-%d %H:%M} UTC by "
            f"{held.paused_by} ({held.reason!r}); operator {operator}"
        )
