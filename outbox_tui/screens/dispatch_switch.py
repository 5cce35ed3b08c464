"""The dispatch switch (``s``): start or stop the console's in-process dispatcher."""

from __future__ import annotations

from rich.text import Text
from textual import on, work

from engine.errors import OutboxError
from outbox_tui.dispatch_control import DispatchExit, describe_summary
from outbox_tui.messages import (
    DispatchChanged,
)
from outbox_tui.screens.base import ConsoleScreen
from outbox_tui.screens.confirm import Confirmation, ConfirmModal
from outbox_tui.widgets.dispatchers import DispatchersPanel
from outbox_tui.widgets.format import one_line
from outbox_tui.widgets.status_bar import StatusBar


class DispatchSwitch(ConsoleScreen):
    """Starts and stops ``DispatchControl`` from workers; the state shows in the status bar."""

    # -- dispatch -----------------------------------------------------------------------

    def action_start_dispatch(self) -> None:
        control = self.console_app.dispatch
        reason = control.unavailable_reason()
        if reason:
            self.say(reason, title="Cannot start dispatch", severity="warning", timeout=10)
            return
        self.dispatch_state = "starting"
        self._start_dispatch()

    @work(exclusive=True, group="dispatch", exit_on_error=False)
    async def _start_dispatch(self) -> None:
        control = self.console_app.dispatch
        try:
            await control.start()
        except OutboxError as exc:
            self.post_message(DispatchChanged(False, error=one_line(exc)))
            return
        self.post_message(DispatchChanged(True, note=f"{control.instance_id} → {control.target}"))

    def action_stop_dispatch(self) -> None:
        self.app.push_screen(
            ConfirmModal(
                "Stop dispatch",
                Text(
                    "Stop the console's dispatcher? It finishes the batch it holds, marks its "
                    "heartbeat stopped and exits. Other dispatchers are not affected."
                ),
                confirm_label="Stop",
            ),
            self._stop_decided,
        )

    def _stop_decided(self, decision: Confirmation | None) -> None:
        if decision is None:
            return
        self.dispatch_state = "stopping"
        self._stop_dispatch()

    @work(exclusive=True, group="dispatch", exit_on_error=False)
    async def _stop_dispatch(self) -> None:
        outcome = await self.console_app.dispatch.stop()
        if outcome is None:
            self.post_message(DispatchChanged(False))
            return
        self.post_message(
            DispatchChanged(False, note=describe_summary(outcome.summary), error=outcome.error)
        )

    def _dispatch_exited(self, outcome: DispatchExit) -> None:
        """The loop ended by itself (a crash, or a storage error it gave up on)."""
        if not outcome.requested:
            error = outcome.error or "the dispatch loop ended by itself"
            self.post_message(DispatchChanged(False, error=error))

    @on(DispatchChanged)
    def _dispatch_changed(self, message: DispatchChanged) -> None:
        self.dispatch_state = "running" if message.running else "stopped"
        if message.error:
            title = "Dispatch failed" if not message.running else "Dispatch"
            self.say(message.error, title=title, severity="error", timeout=10)
        elif message.running:
            self.say(message.note, title="Dispatch started", timeout=4)
        else:
            self.say(message.note or "stopped", title="Dispatch stopped", timeout=4)
        self.poll_now()

    def watch_dispatch_state(self, state: str) -> None:
        bar = self.query_one(StatusBar)
        bar.dispatch = state
        bar.dispatch_target = self.console_app.dispatch.target
        self.query_one(DispatchersPanel).local_dispatch_changed(state)
