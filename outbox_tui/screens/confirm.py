"""The one confirmation dialog every destructive action goes through (replay, stop)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import RenderableType
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from outbox_tui.widgets.text_field import TextField


@dataclass(frozen=True, slots=True)
class Confirmation:
    """The operator said yes; ``reason`` is what they typed (None when left empty)."""

    reason: str | None = None


class ConfirmModal(ModalScreen[Confirmation | None]):
    """Dismisses with a ``Confirmation`` on ``y`` or the confirm button, None otherwise.

    The focus starts on Cancel, so a stray ``enter`` changes nothing. Typing any other
    letter than ``y``/``n`` starts the optional reason (the field takes the focus and
    the letter), as does ``tab`` or a paste; ``enter`` there moves to the confirm
    button rather than confirming, so only ``y`` or the button ever proceeds.

    Once the reason has started every printable key is text, ``y`` and ``n`` too,
    including the keys of a burst (a fast typist, ``tmux send-keys``) that Textual had
    already queued for the button before the field took the focus.
    """

    AUTO_FOCUS = "#cancel"

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
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.body = body
        self.confirm_label = confirm_label
        self.ask_reason = ask_reason
        self.reason_placeholder = reason_placeholder
        self.reason_label = reason_label

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-dialog", classes="dialog"):
            yield Label(Content(self.title_text), id="confirm-title", classes="dialog-title")
            yield Static(self.body, id="confirm-body")
            if self.ask_reason:
                yield Label(self.reason_label, id="reason-label", classes="field-label")
                yield TextField(
                    placeholder=self.reason_placeholder,
                    id="reason",
                    max_length=500,
                    select_on_focus=False,  # the first letter typed is kept, not selected
                )
            with Horizontal(classes="dialog-buttons"):
                yield Button(Content(f"{self.confirm_label}  [y]"), id="confirm", variant="error")
                yield Button(Content("Cancel  [n]"), id="cancel", variant="default")

    def on_mount(self) -> None:
        self.set_focus(self.query_one("#cancel", Button))

    def on_key(self, event: events.Key) -> None:
        """Start the reason with the first letter typed, wherever the focus is.

        A printable key gets here only when a button had it (the field keeps its own):
        before the reason starts ``y``/``n`` are left to the bindings; after it started
        (the key was queued for a button before the field took the focus) it is text.
        """
        if not self.ask_reason or not event.is_printable or event.character is None:
            return
        reason = self.query_one("#reason", Input)
        if self.focused is not reason:
            if event.character in ("y", "n"):
                return
            self.set_focus(reason)  # at once: the next key of a burst finds the field
        event.stop()
        event.prevent_default()
        reason.insert_text_at_cursor(event.character)

    def on_paste(self, event: events.Paste) -> None:
        """A paste that reached a button (the focus starts on Cancel) is the reason."""
        if not self.ask_reason or not event.text:
            return
        reason = self.query_one("#reason", Input)
        self.set_focus(reason)
        event.stop()
        reason.insert_text_at_cursor(event.text.splitlines()[0])

    def action_confirm(self) -> None:
        reason = ""
        if self.ask_reason:
            reason = self.query_one("#reason", Input).value.strip()
        self.dismiss(Confirmation(reason or None))

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#confirm")
    def _confirm_pressed(self) -> None:
        self.action_confirm()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel()

    @on(Input.Submitted, "#reason")
    def _reason_done(self) -> None:
        self.set_focus(self.query_one("#confirm", Button))
