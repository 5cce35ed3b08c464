"""``outbox-tui dead-letter list|replay|skip``: inspect dead letters and act on them (audited).

The checks and the changes come from ``engine.operations``, the same code the
console's ``r``, ``R`` and ``k`` run. ``matched`` counts the selected ids that
are dead letters (docs/cli.md), in a dry run and a real replay alike.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from engine.insights import EventFilter
from engine.operations import (
    insights_for,
    open_database,
    plan_replay_matching,
    plan_replay_of_ids,
    plan_skip,
    replay,
    skip,
)
from engine.replay import default_operator
from engine.schema import DEAD_LETTER
from outbox_tui import PROG, output
from outbox_tui.cli.errors import EXIT_FAILURE, EXIT_OK, UsageError
from outbox_tui.cli.options import Invocation, Parser, add_json, subparser
from outbox_tui.output import ReplayReport, SkipReport


def register(sub: Any) -> None:
    p = subparser(
        sub,
        "dead-letter",
        "list, replay or skip dead-letter events",
        "Inspect and replay events that exhausted their attempts or failed permanently, "
        "or skip the ones that hold back their ordering key.",
        f"{PROG} dead-letter list --json",
        f"{PROG} dead-letter replay --event-id 0190... --yes --reason 'fixed the bug'",
        f"{PROG} dead-letter skip --event-id 0190... --yes --reason 'handled by hand'",
    )
    inner = p.add_subparsers(dest="dead_letter_command", metavar="ACTION", parser_class=Parser)
    inner.required = True
    _register_list(inner)
    _register_replay(inner)
    _register_skip(inner)


def _register_list(inner: Any) -> None:
    lst = subparser(
        inner,
        "list",
        "list dead letters, newest first",
        "List dead-letter events, newest first.",
        f"{PROG} dead-letter list",
        f"{PROG} dead-letter list --tenant acme --event-type orders.placed --limit 20 --json",
    )
    _add_filters(lst)
    lst.add_argument(
        "--limit",
        metavar="N",
        type=_positive_int,
        default=100,
        help="at most N events (default 100)",
    )
    add_json(lst, "print a JSON list")
    lst.set_defaults(run=list_dead_letters)


def _register_replay(inner: Any) -> None:
    rep = subparser(
        inner,
        "replay",
        "send dead letters back to pending (audited)",
        "Move dead letters back to pending with a fresh attempt budget. The dispatcher "
        "delivers them as usual; this command never runs handlers. Every replay is "
        "recorded in outbox_replay_log with operator and reason. Ids that are not dead "
        "letters are refused one by one; the others are still replayed.",
        f"{PROG} dead-letter replay --event-id ID1 --event-id ID2 --yes --reason 'API fixed'",
        f"{PROG} dead-letter replay --all --tenant acme --dry-run",
        f"{PROG} dead-letter replay --all --event-type orders.placed --yes --operator alice",
    )
    which = rep.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--event-id",
        metavar="ID",
        action="append",
        dest="event_ids",
        help="an event to replay; repeatable",
    )
    which.add_argument(
        "--all",
        action="store_true",
        dest="replay_all",
        help="every dead letter matching --tenant/--event-type",
    )
    _add_filters(rep)
    _add_audited_action(
        rep, "replay", "only count what would be replayed (by type); change nothing"
    )
    rep.set_defaults(run=replay_dead_letters)


def _register_skip(inner: Any) -> None:
    skp = subparser(
        inner,
        "skip",
        "release the ordering keys dead letters hold back (audited)",
        "A dead letter with an ordering key holds back the later events of its key. "
        "Skipping it lets them go on without it: it stays in the dead letter (a replay "
        "later sends it to the back of its key). Prints how many waiting events each skip "
        "releases. Every skip is recorded in outbox_replay_log with operator and reason. "
        "Ids that are not dead letters, have no ordering key or were skipped already are "
        "refused one by one; the others are still skipped.",
        f"{PROG} dead-letter skip --event-id ID --yes --reason 'refund handled by hand'",
        f"{PROG} dead-letter skip --event-id ID1 --event-id ID2 --dry-run --json",
    )
    skp.add_argument(
        "--event-id",
        metavar="ID",
        action="append",
        dest="event_ids",
        required=True,
        help="a dead letter whose key to release; repeatable",
    )
    _add_audited_action(
        skp, "skip", "only report what would be skipped and released; change nothing"
    )
    skp.set_defaults(run=skip_dead_letters)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _add_audited_action(parser: argparse.ArgumentParser, action: str, dry_run: str) -> None:
    """The options every audited operator action has: dry run, confirmation, who and why."""
    parser.add_argument("--dry-run", action="store_true", help=dry_run)
    parser.add_argument("--yes", action="store_true", help=f"confirm the {action} (required)")
    parser.add_argument("--reason", metavar="TEXT", help="why (stored in the audit log)")
    parser.add_argument(
        "--operator", metavar="NAME", help="who (stored in the audit log; default: the OS user)"
    )
    add_json(parser, "print one JSON object")


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", metavar="T", help="only this tenant_id")
    parser.add_argument("--event-type", metavar="E", help="only this event type")


def _confirmed(args: argparse.Namespace, action: str, only: str) -> None:
    if not args.dry_run and not args.yes:
        raise UsageError(
            f"refusing to {action} without confirmation: add --yes (or --dry-run to only {only})"
        )


# -- list ------------------------------------------------------------------------------


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


# -- replay ----------------------------------------------------------------------------


async def replay_dead_letters(inv: Invocation) -> int:
    args = inv.args
    if args.event_ids and (args.tenant or args.event_type):
        raise UsageError("--tenant and --event-type filter --all; with --event-id give ids only")
    _confirmed(args, "replay", "count")
    report = ReplayReport(
        dry_run=args.dry_run, operator=args.operator or default_operator(), reason=args.reason
    )
    async with open_database(inv.database_url, "command") as engine:
        insights = insights_for(engine)
        if args.replay_all:
            flt = EventFilter(
                statuses=(DEAD_LETTER,), tenant_id=args.tenant, event_type=args.event_type
            )
            plan = await plan_replay_matching(insights, flt)
        else:
            plan = await plan_replay_of_ids(insights, args.event_ids)
        report.matched, report.by_type, report.refused = plan.matched, plan.by_type, plan.refused
        if not args.dry_run and plan.ids:
            with _progress(inv, total=plan.matched) as advance:
                outcome = await replay(
                    engine,
                    plan.ids,
                    operator=report.operator,
                    reason=report.reason,
                    progress=advance,
                )
            report.replayed = outcome.replayed
            report.refused.update(outcome.refused)
    _print_replay(inv, report)
    return EXIT_FAILURE if report.refused else EXIT_OK


@contextlib.contextmanager
def _progress(inv: Invocation, *, total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on a terminal when the replay takes more than one transaction."""
    from engine.operations import REPLAY_CHUNK

    if total <= REPLAY_CHUNK or not inv.out.err_console.is_terminal:
        yield lambda _n: None
        return
    from rich.progress import Progress

    with Progress(console=inv.out.err_console, transient=True) as progress:
        task = progress.add_task("replaying", total=total)
        yield lambda n: progress.advance(task, n)


def _print_replay(inv: Invocation, report: ReplayReport) -> None:
    for event_id, why in report.refused.items():
        verb = "would refuse" if report.dry_run else "cannot replay"
        inv.out.error(f"{verb} {event_id}: {why}")
    if inv.json:
        inv.out.json(report.as_dict())
        return
    if not report.dry_run and not report.matched and not report.refused:
        inv.out.say("nothing to replay: no dead letters match")
        return
    for line in output.replay_text(report):
        inv.out.say(line)


# -- skip ------------------------------------------------------------------------------


async def skip_dead_letters(inv: Invocation) -> int:
    args = inv.args
    _confirmed(args, "skip", "check")
    report = SkipReport(
        dry_run=args.dry_run, operator=args.operator or default_operator(), reason=args.reason
    )
    async with open_database(inv.database_url, "command") as engine:
        plan = await plan_skip(insights_for(engine), args.event_ids)
        report.matched, report.refused = len(plan.ids), plan.refused
        report.keys, report.released = plan.keys, plan.released
        if plan.ids and not args.dry_run:
            outcome = await skip(engine, plan.ids, operator=report.operator, reason=report.reason)
            report.skipped = outcome.skipped
            report.refused.update(outcome.refused)
            report.released = {i: report.released[i] for i in outcome.skipped}
            report.keys = {i: report.keys[i] for i in outcome.skipped}
    _print_skip(inv, report)
    return EXIT_FAILURE if report.refused else EXIT_OK


def _print_skip(inv: Invocation, report: SkipReport) -> None:
    for event_id, why in report.refused.items():
        verb = "would refuse" if report.dry_run else "cannot skip"
        inv.out.error(f"{verb} {event_id}: {why}")
    if inv.json:
        inv.out.json(report.as_dict())
        return
    for line in output.skip_text(report):
        inv.out.say(line)
