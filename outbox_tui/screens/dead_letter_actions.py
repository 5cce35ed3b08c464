"""Replay (``r``, ``R``) and skip (``k``) from the console, each after one confirmation.

A part of ``MainScreen``: it is handed what to act on (the highlighted ``Target``, the
current ``ViewState``) and calls ``changed`` once the outbox changed. The checks and
changes are ``engine.service``', the same the CLI's ``dead-letter replay|skip`` run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work

from engine.errors import OutboxError
from engine.operating.insights import EventFilter
from engine.service import plan_replay_matching, replay, skip
from engine.storage.schema import DEAD_LETTER
from outbox_tui.messages import (
    ActionFailed,
    ReplayFinished,
    ReplayPrepared,
    SkipFinished,
    SkipPrepared,
)
from outbox_tui.screens.base import ScreenPart
from outbox_tui.screens.browser import BLOCKED, EVENTS, Target, ViewState
from outbox_tui.screens.confirm import Confirmation, ConfirmModal
from outbox_tui.screens.incident_actions import ReplayConfirm, dedup_line, with_warning
from outbox_tui.widgets.format import one_line, short_id

if TYPE_CHECKING:
    from outbox_tui.app import OutboxConsole


def _events(n: int) -> str:
    return f"{n:,} waiting event{'' if n == 1 else 's'}"


def skip_body(message: SkipPrepared) -> Text:
    """What the skip releases: the dead letter, its key, and how many events wait behind it."""
    text = Text.assemble(
        "Skip dead letter ",
        (short_id(message.event_id), "bold"),
        f" ({message.kind})?\n\n",
        ("  ordering key  ", "#8a8a8a"),
        (message.ordering_key, "bold"),
        "\n",
        ("  releases      ", "#8a8a8a"),
        (_events(message.waiting), "bold #ffaf5f" if message.waiting else "bold"),
        "\n",
    )
    text.append(
        "\nIt stays in the dead letter; the events of its key go on without it. A replay "
        "later sends it to the back of its key. The skip is written to the audit log.",
        style="#8a8a8a",
    )
    return text


def replay_body(total: int, by_type: Mapping[str, int], scope: str) -> Text:
    """``Replay 3 dead letters …`` with one line per event type."""
    noun = "dead letter" if total == 1 else "dead letters"
    text = Text.assemble("Replay ", (f"{total:,} {noun}", "bold"), f" ({scope}):\n")
    for event_type, n in list(by_type.items())[:8]:
        text.append(f"  • {event_type} ", style="bold")
        text.append(f"× {n:,}\n")
    if len(by_type) > 8:
        text.append(f"  • … and {len(by_type) - 8} more types\n", style="#8a8a8a")
    text.append(
        "\nThey go back to pending with a fresh attempt budget; the dispatcher picks them "
        "up. Each replay is written to the replay audit log.",
        style="#8a8a8a",
    )
    return text


class DeadLetterActions(ScreenPart):
    """Replay and skip of dead letters from the main screen."""

    def __init__(self, console: OutboxConsole, *, changed: Callable[[], None]) -> None:
        super().__init__(console)
        self._changed = changed  # the outbox changed: the screen refreshes now

    # -- replay -------------------------------------------------------------------------

    def replay_one(self, target: Target | None) -> None:
        """Replay the highlighted dead letter (nothing when it is not one)."""
        if target is None or target.status != DEAD_LETTER:
            return
        body = replay_body(1, {target.kind: 1}, f"event {short_id(target.id)}")
        self._confirm_replay(ReplayConfirm("Replay dead letter", body, "Replay", (target.id,)))

    def replay_matching(self, view: ViewState) -> None:
        """Replay every dead letter the filter of ``view`` matches."""
        if view.mode == BLOCKED:
            return
        if view.mode == EVENTS and view.filter.statuses and DEAD_LETTER not in view.filter.statuses:
            self.say(
                f"The filter ({view.describe()}) matches no dead letters: press d, or widen it.",
                title="Nothing to replay",
                severity="warning",
            )
            return
        self._prepare_replay(view.filter)

    @work(exclusive=True, group="replay", exit_on_error=False)
    async def _prepare_replay(self, flt: EventFilter) -> None:
        """The CLI's ``dead-letter replay --all`` plan: every dead letter ``flt`` matches."""
        console = self.console
        try:
            plan = await console.db(plan_replay_matching(console.insights, flt))
        except OutboxError as exc:
            self.post_message(ActionFailed("Replay", one_line(exc)))
            return
        self.post_message(ReplayPrepared(flt, plan.matched, dict(plan.by_type), tuple(plan.ids)))

    @on(ReplayPrepared)
    def _replay_prepared(self, message: ReplayPrepared) -> None:
        flt = message.filter
        scope = replace(flt, statuses=()).describe()
        scope = "every dead letter" if scope == "all events" else f"matching {scope}"
        if message.total == 0:
            self.say(f"No dead letters ({scope}).", title="Nothing to replay")
            return
        body = replay_body(message.total, message.by_type, scope)
        label = f"Replay {message.total:,}"
        self._confirm_replay(ReplayConfirm("Replay dead letters", body, label, message.ids))

    @work(exclusive=True, group="replay", exit_on_error=False)
    async def _confirm_replay(self, ask: ReplayConfirm) -> None:
        """Count the events older than the dedup window, then ask (the dialog warns)."""
        console = self.console
        try:
            warning = await console.db(dedup_line(console, ask.ids))
        except OutboxError as exc:
            self.post_message(ActionFailed("Replay", one_line(exc)))
            return
        self.post_message(replace(ask, body=with_warning(ask.body, warning)))

    @on(ReplayConfirm)
    def _replay_confirm(self, ask: ReplayConfirm) -> None:
        self.app.push_screen(
            ConfirmModal(ask.title, ask.body, confirm_label=ask.label, ask_reason=True),
            lambda decision: self._replay_decided(decision, ask.ids),
        )

    def _replay_decided(self, decision: Confirmation | None, ids: Sequence[str]) -> None:
        if decision is None:
            self.say("Replay cancelled; nothing changed.", timeout=3)
            return
        self._replay(tuple(ids), decision.reason)

    @work(exclusive=True, group="replay", exit_on_error=False)
    async def _replay(self, ids: tuple[str, ...], reason: str | None) -> None:
        """Replay exactly the ids the operator confirmed (never rows that arrived since)."""
        console = self.console
        try:
            outcome = await console.db(
                replay(console.engine, ids, operator=console.operator, reason=reason)
            )
        except OutboxError as exc:
            self.post_message(ReplayFinished(0, {}, one_line(exc)))
            return
        self.post_message(ReplayFinished(len(outcome.replayed), outcome.refused))

    @on(ReplayFinished)
    def _replay_finished(self, message: ReplayFinished) -> None:
        if message.error:
            self.say(message.error, title="Replay failed", severity="error", timeout=8)
            return
        noun = "dead letter" if message.replayed == 1 else "dead letters"
        text = f"{message.replayed:,} {noun} back to pending."
        if message.refused:
            why = next(iter(message.refused.values()))
            self.say(
                f"{text} {len(message.refused):,} refused ({why}).",
                title="Replay partly done",
                severity="warning",
                timeout=8,
            )
        else:
            self.say(text, title="Replayed", timeout=5)
        self._changed()

    # -- skip ---------------------------------------------------------------------------

    def skip_dead_letter(self, target: Target | None) -> None:
        """Release the key a dead letter holds back, after a confirmation naming what waits."""
        if target is None or target.status != DEAD_LETTER or target.ordering_key is None:
            return  # the binding is disabled then (check_action)
        self._prepare_skip(target)

    @work(exclusive=True, group="skip", exit_on_error=False)
    async def _prepare_skip(self, target: Target) -> None:
        """Count what waits behind it now, so the confirmation can say what a skip releases."""
        insights, db = self.console.insights, self.console.db
        try:
            detail = await db(insights.event_detail(target.id))
            waiting = await db(insights.waiting_behind(target.id))
        except OutboxError as exc:
            self.post_message(ActionFailed("Skip", one_line(exc)))
            return
        columns = detail.columns
        if columns.get("status") != DEAD_LETTER:
            status = str(columns.get("status")).replace("_", " ")
            self.post_message(ActionFailed("Skip", f"it is {status} now, not a dead letter"))
        elif columns.get("skipped_at") is not None:
            self.post_message(ActionFailed("Skip", "it was skipped already; its key goes on"))
        else:
            key = str(columns.get("ordering_key") or target.ordering_key)
            self.post_message(SkipPrepared(target.id, target.kind, key, waiting))

    @on(SkipPrepared)
    def _skip_prepared(self, message: SkipPrepared) -> None:
        self.app.push_screen(
            ConfirmModal(
                "Skip dead letter",
                skip_body(message),
                confirm_label="Skip",
                ask_reason=True,
                reason_placeholder="why (kept in the audit log)",
            ),
            lambda decision: self._skip_decided(decision, message),
        )

    def _skip_decided(self, decision: Confirmation | None, message: SkipPrepared) -> None:
        if decision is None:
            self.say("Skip cancelled; nothing changed.", timeout=3)
            return
        self._skip(message, decision.reason)

    @work(exclusive=True, group="skip", exit_on_error=False)
    async def _skip(self, message: SkipPrepared, reason: str | None) -> None:
        console = self.console
        event_id, key = message.event_id, message.ordering_key
        try:
            result = await console.db(
                skip(console.engine, [event_id], operator=console.operator, reason=reason)
            )
        except OutboxError as exc:
            self.post_message(SkipFinished(event_id, key, message.waiting, error=one_line(exc)))
            return
        refused = result.refused.get(event_id)
        self.post_message(SkipFinished(event_id, key, message.waiting, refused=refused))

    @on(SkipFinished)
    def _skip_finished(self, message: SkipFinished) -> None:
        if message.error:
            self.say(message.error, title="Skip failed", severity="error", timeout=8)
            return
        if message.refused:
            self.say(
                f"{short_id(message.event_id)} was not skipped: {message.refused}.",
                title="Not skipped",
                severity="warning",
                timeout=8,
            )
            return
        self.say(
            f"{short_id(message.event_id)} skipped: {_events(message.waiting)} of "
            f"{message.ordering_key} released.",
            title="Skipped",
            timeout=5,
        )
        self._changed()
