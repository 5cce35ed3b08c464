"""``outbox-tui dead-letter list|groups|replay|skip``: inspect dead letters and act on them.

Why one module: the four subcommands are one command group
(docs/cli.md documents them together) and share its filter options, the audited
action's ``--yes``/``--reason``/``--dry-run`` and the dedup-window check; the work
itself is ``engine.service``'.

``groups`` groups failed rows and dead letters by error fingerprint; ``replay --group``
replays one group's dead letters. Every replay first counts the events older than the
consumers' dedup window and refuses when there are any, unless
``--allow-outside-dedup-window`` is given (a dry run only reports them).

The checks and the changes come from ``engine.service``, the same code the
console's ``r``, ``R`` and ``k`` run. ``matched`` counts the selected ids that
are dead letters (docs/cli.md), in a dry run and a real replay alike.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from engine.operating.error_groups import DEFAULT_SCAN_LIMIT
from engine.operating.insights import EventFilter
from engine.operating.replay import default_operator
from engine.service import (
    dedup_check,
    error_groups,
    group_events,
    insights_for,
    open_database,
    plan_replay_matching,
    plan_replay_of_group,
    plan_replay_of_ids,
    plan_skip,
    replay,
    replay_of_group,
    skip,
)
from engine.settings import OutboxSettings
from engine.storage.schema import DEAD_LETTER
from outbox_tui import PROG, output
from outbox_tui.cli.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, UsageError
from outbox_tui.cli.options import (
    Invocation,
    Parser,
    add_json,
    add_settings,
    fingerprint,
    positive_int,
    subparser,
    text_of_at_most,
)
from outbox_tui.output import ReplayReport, SkipReport

# Not empty; as long as SQLite lets a plain-SQL producer make one (PostgreSQL: 36).
EVENT_ID = text_of_at_most(4096)


def register(sub: Any) -> None:
    p = subparser(
        sub,
        "dead-letter",
        "list, replay or skip dead-letter events",
        "Inspect and replay events that exhausted their attempts or failed permanently, "
        "or skip the ones that hold back their ordering key.",
        f"{PROG} dead-letter list --json",
        f"{PROG} dead-letter groups",
        f"{PROG} dead-letter replay --group 3978ad63b895 --yes --reason 'vendor back'",
        f"{PROG} dead-letter replay --event-id 0190... --yes --reason 'fixed the bug'",
        f"{PROG} dead-letter skip --event-id 0190... --yes --reason 'handled by hand'",
    )
    inner = p.add_subparsers(dest="dead_letter_command", metavar="ACTION", parser_class=Parser)
    inner.required = True
    _register_list(inner)
    _register_groups(inner)
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
        type=positive_int,
        default=100,
        help="at most N events (default 100)",
    )
    add_json(lst, "print a JSON list")
    lst.set_defaults(run=list_dead_letters)


def _register_groups(inner: Any) -> None:
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


def _register_replay(inner: Any) -> None:
    rep = subparser(
        inner,
        "replay",
        "send dead letters back to pending (audited)",
        "Move dead letters back to pending with a fresh attempt budget. The dispatcher "
        "delivers them as usual; this command never runs handlers. Every replay is "
        "recorded in outbox_replay_log with operator and reason. Ids that are not dead "
        "letters are refused one by one; the others are still replayed. A replay that "
        "includes events older than the consumers' dedup window (--dedup-window-seconds) is "
        "refused unless --allow-outside-dedup-window is given: consumers may process those "
        "events twice.",
        f"{PROG} dead-letter replay --event-id ID1 --event-id ID2 --yes --reason 'API fixed'",
        f"{PROG} dead-letter replay --all --tenant acme --dry-run",
        f"{PROG} dead-letter replay --all --event-type orders.placed --yes --operator alice",
        f"{PROG} dead-letter replay --group 3978ad63b895 --yes --allow-outside-dedup-window",
    )
    which = rep.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--event-id",
        metavar="ID",
        type=EVENT_ID,
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
    which.add_argument(
        "--group",
        metavar="FINGERPRINT",
        type=fingerprint,
        help="every dead letter of this error group (see dead-letter groups)",
    )
    _add_filters(rep)
    rep.add_argument(
        "--allow-outside-dedup-window",
        action="store_true",
        help="replay even events older than the consumers' dedup window",
    )
    add_settings(rep, OutboxSettings, ("dedup_window_seconds",))
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
        type=EVENT_ID,
        action="append",
        dest="event_ids",
        required=True,
        help="a dead letter whose key to release; repeatable",
    )
    _add_audited_action(
        skp, "skip", "only report what would be skipped and released; change nothing"
    )
    skp.set_defaults(run=skip_dead_letters)


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


# -- groups ----------------------------------------------------------------------------


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


# -- replay ----------------------------------------------------------------------------


async def replay_dead_letters(inv: Invocation) -> int:
    args = inv.args
    if (args.event_ids or args.group) and (args.tenant or args.event_type):
        raise UsageError(
            "--tenant and --event-type filter --all; with --event-id or --group leave them out"
        )
    _confirmed(args, "replay", "count")
    window = inv.settings.dedup_window_seconds
    report = ReplayReport(
        dry_run=args.dry_run,
        operator=args.operator or default_operator(),
        reason=args.reason,
        dedup_window_seconds=window,
    )
    async with open_database(inv.database_url, "command") as engine:
        insights = insights_for(engine)
        if args.replay_all:
            flt = EventFilter(
                statuses=(DEAD_LETTER,), tenant_id=args.tenant, event_type=args.event_type
            )
            plan = await plan_replay_matching(insights, flt)
        elif args.group:
            plan = await plan_replay_of_group(engine, args.group)
            if not plan.ids:  # an unknown fingerprint, or a group of failed rows only
                report.group_failed = len((await group_events(engine, args.group)).ids)
                if not report.group_failed:
                    return inv.out.failed(
                        f"no error group has the fingerprint {args.group!r}: nothing replayed "
                        f"(`{PROG} dead-letter groups` lists them)",
                        EXIT_FAILURE,
                    )
        else:
            plan = await plan_replay_of_ids(insights, args.event_ids)
        report.matched, report.by_type, report.refused = plan.matched, plan.by_type, plan.refused
        if plan.ids:
            checked = await dedup_check(engine, plan.ids, window_seconds=window)
            report.outside_dedup_window = checked.outside
            report.dedup_note = checked.warning()
        if report.outside_dedup_window and not args.allow_outside_dedup_window:
            report.refused_all = "outside the dedup window"
        elif not args.dry_run and plan.ids:
            with _progress(inv, total=plan.matched) as advance:
                if args.group:
                    outcome = await replay_of_group(
                        engine, args.group, operator=report.operator, reason=report.reason
                    )
                    advance(plan.matched)
                else:
                    outcome = await replay(
                        engine,
                        plan.ids,
                        operator=report.operator,
                        reason=report.reason,
                        progress=advance,
                    )
            report.replayed = outcome.replayed
            report.refused.update(outcome.refused)
    if report.refused_all and not args.dry_run:
        return _refuse_outside_window(inv, report)
    _print_replay(inv, report)
    return EXIT_FAILURE if report.refused else EXIT_OK


def _refuse_outside_window(inv: Invocation, report: ReplayReport) -> int:
    """Nothing replayed: one error line naming the count, and the report for --json."""
    if inv.json:
        inv.out.json(report.as_dict())
    inv.out.error(
        f"refusing to replay: {output.dedup_warning(report)}; nothing replayed "
        "(add --allow-outside-dedup-window to replay them anyway)"
    )
    return EXIT_USAGE


@contextlib.contextmanager
def _progress(inv: Invocation, *, total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on a terminal when the replay takes more than one transaction."""
    from engine.service import REPLAY_CHUNK

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
        if report.group_failed:
            inv.out.say(
                f"nothing to replay: the group has {report.group_failed:,} failed rows and "
                "no dead letters (failed rows retry by themselves)"
            )
            return
        inv.out.say("nothing to replay: no dead letters match")
        return
    warning = output.dedup_warning(report)
    if warning and not report.dry_run:
        inv.out.note(warning)
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
