"""The one confirmation dialog every destructive action goes through (replay, skip,
pause, stop).

One input model, whatever the speed of the typing: the reason field (when the dialog
asks for one) has the focus from the start and takes every printable key, ``y`` and
``n`` too; ``enter`` there moves to the confirm button; on the buttons ``y`` confirms,
``n`` cancels and ``enter`` presses the focused one; escape cancels anywhere. A
dialog without a reason starts on Cancel, so a stray ``enter`` changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import RenderableType
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from outbox_tui.widgets.text_field import TextField

REASON_HINT = "enter, then y"  # how to proceed from the field, beside its label


@dataclass(frozen=True, slots=True)
class Confirmation:
    """The operator said yes; ``reason`` is what they typed (None when left empty)."""

    reason: str | None = None


class ConfirmModal(ModalScreen[Confirmation | None]):
    """Dismisses with a ``Confirmation`` on ``y`` or the confirm button, None otherwise.

    ``reason_needed`` makes the reason required: it is the sentence the dialog shows,
    staying open with the focus in the field, when ``y`` comes with none.

    Keys of one burst (a fast typist, ``tmux send-keys``) are all queued for the widget
    focused when they were read: ``TextField`` hands those after its ``enter`` on to the
    button, and a letter other than ``y``/``n`` that reaches a button is typed into the
    reason, so no key is lost and none acts twice.
    """

    BINDINGS = [  # noqa: RUF012 - Textual's declaration style
        Binding("y", "confirm", "Confirm", id="confirm"),
        Binding("n", "cancel", "Cancel", id="cancel"),
        Binding("escape", "cancel", "Cancel", show=False),
    ]

    def __init__(
        self,
        title: str,
        body: RenderableType,
        *,
        confirm_label: str,
        ask_reason: bool = False,
        reason_placeholder: str = "why (kept in the replay audit log)",
        reason_label: str = "Reason (optional)",
        reason_needed: str | None = None,
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.body = body
        self.confirm_label = confirm_label
        self.ask_reason = ask_reason or reason_needed is not None
        self.reason_placeholder = reason_placeholder
        self.reason_label = reason_label
        self.reason_needed = reason_needed

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-dialog", classes="dialog"):
            yield Label(Content(self.title_text), id="confirm-title", classes="dialog-title")
            yield Static(self.body, id="confirm-body")
            if self.ask_reason:
                yield Label(
                    Content(f"{self.reason_label}  ·  {REASON_HINT}"),
                    id="reason-label",
                    classes="field-label",
                )
                yield TextField(
                    placeholder=self.reason_placeholder,
                    id="reason",
                    max_length=500,
                    select_on_focus=False,
                    enter_moves_on=True,  # to the confirm button, at once
                )
            with Horizontal(classes="dialog-buttons"):
                yield Button(Content(f"{self.confirm_label}  [y]"), id="confirm", variant="error")
                yield Button(Content("Cancel  [n]"), id="cancel", variant="default")

    def on_mount(self) -> None:
        self.set_focus(self.query_one("#reason" if self.ask_reason else "#cancel"))

    @property
    def _reason(self) -> TextField:
        return self.query_one("#reason", TextField)

    def on_key(self, event: events.Key) -> None:
        """A printable key that reached a button: ``y``/``n`` decide, others are the reason.

        The field keeps its own keys, so what gets here came to a button. It is judged
        by where the focus is now: a ``y`` queued behind a refused confirmation, which
        sent the focus back to the field, is text.
        """
        if not self.ask_reason or not event.is_printable or event.character is None:
            return
        reason = self._reason
        if self.focused is not reason and event.character in ("y", "n"):
            return  # the bindings act
        event.stop()
        event.prevent_default()
        self.set_focus(reason)
        reason.insert_text_at_cursor(event.character)

    def on_paste(self, event: events.Paste) -> None:
        """A paste that reached a button is the reason (its first line)."""
        if not self.ask_reason or not event.text:
            return
        reason = self._reason
        self.set_focus(reason)
        event.stop()
        reason.insert_text_at_cursor(event.text.splitlines()[0])

    def action_confirm(self) -> None:
        reason = self._reason.value.strip() if self.ask_reason else ""
        if not reason and self.reason_needed is not None:
            self._ask_for_reason()
            return
        self.dismiss(Confirmation(reason or None))

    def _ask_for_reason(self) -> None:
        """Stay open, point at the field and say why it is needed."""
        label = self.query_one("#reason-label", Label)
        label.update(Content(f"{self.reason_label}: {self.reason_needed}"))
        label.add_class("-missing")
        self.set_focus(self._reason)

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#confirm")
    def _confirm_pressed(self) -> None:
        self.action_confirm()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel()
