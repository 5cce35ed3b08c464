"""``/``: narrow the event list by status, event type, tenant, aggregate id, ordering key and
origin (inbound events, received by the inbox, or local ones)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Button, Input, Label, Static

from engine.operating.event_views import ORIGINS
from engine.operating.insights import EventFilter
from engine.storage.schema import DEAD_LETTER, STATUSES
from outbox_tui.widgets.text_field import TextField

_ALIASES = {"dead": DEAD_LETTER, "deadletter": DEAD_LETTER, "dlq": DEAD_LETTER}


def parse_statuses(text: str) -> tuple[str, ...]:
    """``"pending, dead letter"`` → ``("pending", "dead_letter")``; ValueError names a typo."""
    found: list[str] = []
    for word in re.split(r"[,\s]+", text.strip().lower().replace("dead letter", "dead_letter")):
        if not word:
            continue
        status = _ALIASES.get(word.replace("-", "").replace("_", ""), word.replace("-", "_"))
        if status not in STATUSES:
            raise ValueError(f"unknown status {word!r}: use {', '.join(STATUSES)}")
        if status not in found:
            found.append(status)
    return tuple(found)


class FilterModal(ModalScreen[EventFilter | None]):
    """Dismisses with the new filter (``enter`` / Apply) or None (escape)."""

    BINDINGS = [  # noqa: RUF012 - Textual's declaration style
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+l", "clear", "Clear all"),
    ]

    def __init__(
        self,
        current: EventFilter,
        *,
        dead_letters_only: bool,
        event_types: Sequence[str] = (),
        tenants: Sequence[str] = (),
        ordering_keys: Sequence[str] = (),
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.current = current
        self.dead_letters_only = dead_letters_only
        self.event_types = sorted(set(event_types))
        self.tenants = sorted(set(tenants))
        self.ordering_keys = sorted(set(ordering_keys))

    def compose(self) -> ComposeResult:
        flt = self.current
        with Vertical(id="filter-dialog", classes="dialog"):
            title = "Filter dead letters" if self.dead_letters_only else "Filter events"
            yield Label(title, classes="dialog-title")
            yield Label("Status (comma separated)", classes="field-label")
            status = TextField(
                value="dead_letter" if self.dead_letters_only else ", ".join(flt.statuses),
                placeholder=", ".join(STATUSES),
                suggester=SuggestFromList(STATUSES, case_sensitive=False),
                id="filter-status",
                disabled=self.dead_letters_only,
            )
            yield status
            yield Label("Event type", classes="field-label")
            yield TextField(
                value=flt.event_type or "",
                placeholder="any, e.g. "
                + (self.event_types[0] if self.event_types else "orders.placed"),
                suggester=SuggestFromList(self.event_types, case_sensitive=True),
                id="filter-type",
            )
            yield Label("Tenant", classes="field-label")
            yield TextField(
                value=flt.tenant_id or "",
                placeholder="any",
                suggester=SuggestFromList(self.tenants, case_sensitive=True),
                id="filter-tenant",
            )
            yield Label("Aggregate id", classes="field-label")
            yield TextField(value=flt.aggregate_id or "", placeholder="any", id="filter-aggregate")
            yield Label("Ordering key (shows the key's undelivered events)", classes="field-label")
            yield TextField(
                value=flt.ordering_key or "",
                placeholder="any, e.g. "
                + (self.ordering_keys[0] if self.ordering_keys else "order:<order id>"),
                suggester=SuggestFromList(self.ordering_keys, case_sensitive=True),
                id="filter-key",
            )
            yield Label("Origin (inbound: received by the inbox; local)", classes="field-label")
            yield TextField(
                value=flt.origin or "",
                placeholder="any, inbound or local",
                suggester=SuggestFromList(ORIGINS, case_sensitive=False),
                id="filter-origin",
            )
            yield Static("", id="filter-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button(Content("Apply  [enter]"), id="apply", variant="primary")
                yield Button(Content("Clear all  [ctrl+l]"), id="clear")
                yield Button(Content("Cancel  [esc]"), id="cancel")

    def on_mount(self) -> None:
        # At once (``focus()`` waits its turn behind keys already typed, and would take
        # the focus back from a field a fast tab had moved on to).
        first = "#filter-type" if self.dead_letters_only else "#filter-status"
        self.set_focus(self.query_one(first, Input))

    def _value(self, selector: str) -> str | None:
        return self.query_one(selector, Input).value.strip() or None

    def action_apply(self) -> None:
        try:
            statuses = (
                (DEAD_LETTER,)
                if self.dead_letters_only
                else parse_statuses(self.query_one("#filter-status", Input).value)
            )
        except ValueError as exc:
            self.query_one("#filter-error", Static).update(Content(str(exc)))
            self.set_focus(self.query_one("#filter-status", Input))
            return
        origin = (self._value("#filter-origin") or "").lower() or None
        if origin is not None and origin not in ORIGINS:
            self.query_one("#filter-error", Static).update(
                Content(f"unknown origin {origin!r}: use {' or '.join(ORIGINS)}")
            )
            self.set_focus(self.query_one("#filter-origin", Input))
            return
        self.dismiss(
            EventFilter(
                statuses=statuses,
                event_type=self._value("#filter-type"),
                tenant_id=self._value("#filter-tenant"),
                aggregate_id=self._value("#filter-aggregate"),
                ordering_key=self._value("#filter-key"),
                origin=origin,
            )
        )

    def action_clear(self) -> None:
        fields = ("#filter-type", "#filter-tenant", "#filter-aggregate", "#filter-key")
        for field in (*fields, "#filter-origin"):
            self.query_one(field, Input).value = ""
        if not self.dead_letters_only:
            self.query_one("#filter-status", Input).value = ""
        self.query_one("#filter-error", Static).update("")

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_apply()

    @on(Button.Pressed, "#apply")
    def _apply_pressed(self) -> None:
        self.action_apply()

    @on(Button.Pressed, "#clear")
    def _clear_pressed(self) -> None:
        self.action_clear()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel()
