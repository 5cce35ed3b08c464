"""Pause or resume (``p``) the highlighted event's type, and the dedup-window line every
replay dialog shows.

A part of ``MainScreen``: it is handed the highlighted ``Target`` and calls ``changed``
once the pause changed. The changes are ``engine.service``', the same the CLI's
``pause``, ``resume`` and ``dead-letter replay`` run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.message import Message

from engine.errors import OutboxError
from engine.operating.pauses import PausedBacklog, describe_scope
from engine.service import (
    dedup_check,
    pause_type,
    paused_backlog,
    resume_type,
    waiting_of_type,
)
from outbox_tui.messages import ActionFailed
from outbox_tui.screens.base import ScreenPart
from outbox_tui.screens.browser import Target
from outbox_tui.screens.confirm import Confirmation, ConfirmModal
from outbox_tui.widgets.format import one_line

if TYPE_CHECKING:
    from outbox_tui.app import OutboxConsole

WARNING_STYLE = "bold #ffaf5f"
SAFE_STYLE = "#87d787"
PAUSE_NEEDS_A_REASON = "a pause needs a reason. Type it, then enter."


async def dedup_line(console: OutboxConsole, ids: Sequence[str]) -> Text:
    """The dedup-window line for a replay of ``ids``: the warning when some are older
    than the window, else one short line that says the replay is safe for it.

    The window is the configured one, and "now" is the console's clock.
    """
    check = await dedup_check(
        console.engine,
        ids,
        window_seconds=console.config.dedup_window_seconds,
        now=console.clock(),
    )
    warning = check.warning()
    if warning is not None:
        return Text("⚠ " + warning, style=WARNING_STYLE)
    return Text("✓ " + (check.assurance() or ""), style=SAFE_STYLE)


def with_warning(body: Text, line: Text | None) -> Text:
    """A replay dialog's body with its dedup-window line under it, when there is one."""
    if line is None:
        return body
    return Text.assemble(body, "\n\n", line)


@dataclass
class ReplayConfirm(Message):
    """A replay to confirm: the dialog's title, body (with the warning) and button."""

    title: str
    body: Text
    label: str
    ids: Sequence[str]


@dataclass
class PausePrepared(Message):
    """The highlighted type's pause now (None: not paused), ready for the confirmation."""

    event_type: str
    held: PausedBacklog | None
    waiting: int


@dataclass
class PauseFinished(Message):
    text: str
    error: str | None = None


def pause_body(message: PausePrepared) -> Text:
    if message.held is not None:
        p = message.held.pause
        return Text.assemble(
            "Resume ",
            (p.describe(), "bold"),
            "?\n\n",
            ("  paused since  ", "#8a8a8a"),
            f"{p.paused_at:%Y-%m-%d %H:%M} UTC by {p.paused_by}\n",
            ("  reason        ", "#8a8a8a"),
            f"{p.reason}\n",
            ("  waiting       ", "#8a8a8a"),
            (f"{message.held.waiting:,} events", "bold"),
            "\n\nDispatchers deliver them again from their next round.",
        )
    return Text.assemble(
        "Pause ",
        (describe_scope(message.event_type, None), "bold"),
        "?\n\n",
        ("  waiting now   ", "#8a8a8a"),
        (f"{message.waiting:,} events", "bold"),
        "\n\nEvery dispatcher stops claiming this type from its next round: its events "
        "stay pending and spend no attempts until it is resumed. A reason is required.",
    )


class IncidentActions(ScreenPart):
    """Pause and resume of an event type from the main screen."""

    def __init__(self, console: OutboxConsole, *, changed: Callable[[], None]) -> None:
        super().__init__(console)
        self._changed = changed  # the pause changed: the screen refreshes now

    def pause_or_resume(self, target: Target | None) -> None:
        """Pause the type of ``target``, or resume it when it is paused, after a confirmation."""
        if target is None:
            return
        self._prepare_pause(target.kind.rsplit(" v", 1)[0])

    @work(exclusive=True, group="pause", exit_on_error=False)
    async def _prepare_pause(self, event_type: str) -> None:
        console = self.console
        try:
            held = await console.db(paused_backlog(console.engine))
        except OutboxError as exc:
            self.post_message(ActionFailed("Pause", one_line(exc)))
            return
        mine = next(
            (h for h in held if h.pause.event_type == event_type and h.pause.tenant_id is None),
            None,
        )
        try:
            waiting = (
                mine.waiting
                if mine is not None
                else await console.db(waiting_of_type(console.engine, event_type, None))
            )
        except OutboxError as exc:
            self.post_message(ActionFailed("Pause", one_line(exc)))
            return
        self.post_message(PausePrepared(event_type, mine, waiting))

    @on(PausePrepared)
    def _pause_prepared(self, message: PausePrepared) -> None:
        resuming = message.held is not None
        self.app.push_screen(
            ConfirmModal(
                "Resume delivery" if resuming else "Pause delivery",
                pause_body(message),
                confirm_label="Resume" if resuming else "Pause",
                ask_reason=True,
                reason_placeholder="why (kept in the pause audit log)",
                reason_label="Reason (optional)" if resuming else "Reason (required)",
                reason_needed=None if resuming else PAUSE_NEEDS_A_REASON,
            ),
            lambda decision: self._pause_decided(decision, message),
        )

    def _pause_decided(self, decision: Confirmation | None, message: PausePrepared) -> None:
        if decision is None:
            self.say("Nothing changed.", timeout=3)
            return
        self._pause(message, decision.reason)

    @work(exclusive=True, group="pause", exit_on_error=False)
    async def _pause(self, message: PausePrepared, reason: str | None) -> None:
        console = self.console
        scope = describe_scope(message.event_type, None)
        try:
            if message.held is None:
                await console.db(
                    pause_type(
                        console.engine,
                        message.event_type,
                        None,
                        reason=reason or "",
                        operator=console.operator,
                    )
                )
                text = f"{scope} paused: dispatchers stop claiming it from their next round."
            else:
                await console.db(
                    resume_type(
                        console.engine,
                        message.event_type,
                        None,
                        operator=console.operator,
                        reason=reason,
                    )
                )
                text = f"{scope} resumed: its events are delivered again."
        except OutboxError as exc:
            self.post_message(PauseFinished("", one_line(exc)))
            return
        self.post_message(PauseFinished(text))

    @on(PauseFinished)
    def _pause_finished(self, message: PauseFinished) -> None:
        if message.error:
            self.say(message.error, title="Pause failed", severity="error", timeout=8)
            return
        self.say(message.text, title="Pause", timeout=5)
        self._changed()
