"""``dead-letter replay``: send dead letters back to pending, audited.

By id, every dead letter matching ``--tenant``/``--event-type`` (``--all``), or one
error group (``--group``). Every replay first counts the events older than the
consumers' dedup window and refuses when there are any, unless
``--allow-outside-dedup-window`` is given (a dry run only reports them). ``matched``
counts the selected ids that are dead letters (docs/cli.md), in a dry run and a real
replay alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from engine.operating.insights import EventFilter
from engine.operating.replay import default_operator
from engine.service import (
    dedup_check,
    group_events,
    insights_for,
    open_database,
    plan_replay_matching,
    plan_replay_of_group,
    plan_replay_of_ids,
    replay,
    replay_of_group,
)
from engine.settings import OutboxSettings
from engine.storage.schema import DEAD_LETTER
from outbox_tui import PROG, output
from outbox_tui.cli.dead_letter.options import EVENT_ID, add_audited_action, add_filters, confirmed
from outbox_tui.cli.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, UsageError
from outbox_tui.cli.options import Invocation, add_settings, fingerprint, subparser
from outbox_tui.output import ReplayReport


def register(inner: Any) -> None:
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
    add_filters(rep)
    rep.add_argument(
        "--allow-outside-dedup-window",
        action="store_true",
        help="replay even events older than the consumers' dedup window",
    )
    add_settings(rep, OutboxSettings, ("dedup_window_seconds",))
    add_audited_action(rep, "replay", "only count what would be replayed (by type); change nothing")
    rep.set_defaults(run=replay_dead_letters)


async def replay_dead_letters(inv: Invocation) -> int:
    args = inv.args
    if (args.event_ids or args.group) and (args.tenant or args.event_type):
        raise UsageError(
            "--tenant and --event-type filter --all; with --event-id or --group leave them out"
        )
    confirmed(args, "replay", "count")
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
