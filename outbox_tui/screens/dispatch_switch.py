"""The dispatch switch (``s``): start or stop the console's in-process dispatcher.

A part of ``MainScreen``: it drives ``DispatchControl`` from workers, reports the
dispatcher's state through ``set_state`` (the screen shows it and offers start or stop
by it) and calls ``changed`` once the dispatcher started or stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work

from engine.errors import OutboxError
from outbox_tui.dispatch_control import DispatchExit, describe_summary
from outbox_tui.messages import DispatchChanged
from outbox_tui.screens.base import ScreenPart
from outbox_tui.screens.confirm import Confirmation, ConfirmModal
from outbox_tui.widgets.format import one_line

if TYPE_CHECKING:
    from outbox_tui.app import OutboxConsole


class DispatchSwitch(ScreenPart):
    """Starts and stops ``DispatchControl`` from workers."""

    def __init__(
        self,
        console: OutboxConsole,
        *,
        set_state: Callable[[str], None],
        changed: Callable[[], None],
    ) -> None:
        super().__init__(console)
        self._set_state = set_state  # "starting", "running", "stopping" or "stopped"
        self._changed = changed  # the dispatcher started or stopped: the screen refreshes

    def start(self) -> None:
        control = self.console.dispatch
        reason = control.unavailable_reason()
        if reason:
            self.say(reason, title="Cannot start dispatch", severity="warning", timeout=10)
            return
        self._set_state("starting")
        self._start_dispatch()

    @work(exclusive=True, group="dispatch", exit_on_error=False)
    async def _start_dispatch(self) -> None:
        control = self.console.dispatch
        try:
            await control.start()
        except OutboxError as exc:
            self.post_message(DispatchChanged(False, error=one_line(exc)))
            return
        self.post_message(DispatchChanged(True, note=f"{control.instance_id} → {control.target}"))

    def stop(self) -> None:
        """Stop the dispatcher once the operator confirms."""
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
        self._set_state("stopping")
        self._stop_dispatch()

    @work(exclusive=True, group="dispatch", exit_on_error=False)
    async def _stop_dispatch(self) -> None:
        outcome = await self.console.dispatch.stop()
        if outcome is None:
            self.post_message(DispatchChanged(False))
            return
        self.post_message(
            DispatchChanged(False, note=describe_summary(outcome.summary), error=outcome.error)
        )

    def exited(self, outcome: DispatchExit) -> None:
        """``DispatchControl.on_exit``: the loop ended by itself (a crash, or a storage
        error it gave up on), or because it was asked to."""
        if not outcome.requested:
            error = outcome.error or "the dispatch loop ended by itself"
            self.post_message(DispatchChanged(False, error=error))

    @on(DispatchChanged)
    def _dispatch_changed(self, message: DispatchChanged) -> None:
        self._set_state("running" if message.running else "stopped")
        if message.error:
            title = "Dispatch failed" if not message.running else "Dispatch"
            self.say(message.error, title=title, severity="error", timeout=10)
        elif message.running:
            self.say(message.note, title="Dispatch started", timeout=4)
        else:
            self.say(message.note or "stopped", title="Dispatch stopped", timeout=4)
        self._changed()
