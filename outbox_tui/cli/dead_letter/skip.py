"""``dead-letter skip``: release the ordering keys dead letters hold back, audited."""

from __future__ import annotations

from typing import Any

from engine.operating.replay import default_operator
from engine.service import insights_for, open_database, plan_skip, skip
from outbox_tui import PROG, output
from outbox_tui.cli.dead_letter.options import EVENT_ID, add_audited_action, confirmed
from outbox_tui.cli.errors import EXIT_FAILURE, EXIT_OK
from outbox_tui.cli.options import Invocation, subparser
from outbox_tui.output import SkipReport


def register(inner: Any) -> None:
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
    add_audited_action(
        skp, "skip", "only report what would be skipped and released; change nothing"
    )
    skp.set_defaults(run=skip_dead_letters)


async def skip_dead_letters(inv: Invocation) -> int:
    args = inv.args
    confirmed(args, "skip", "check")
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
