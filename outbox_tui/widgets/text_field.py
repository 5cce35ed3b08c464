"""A text field that never keeps a key typed for the field that has the focus now.

Textual hands each key to the widget focused when the app reads it, into that
widget's queue. Keys read in one burst (a fast typist, a paste of keys, ``tmux
send-keys``) are all queued before the first is handled, so when one of them moves
the focus the ones after it still sit in the old field's queue. Worse, ``tab`` moves
the focus only once it has bubbled up to the screen's binding, by which time the
field has taken the letters after it: "failed⇥orders.placed" typed quickly put both
words in the status field.

So here ``tab`` moves the focus as soon as the field handles it (and ``enter`` too,
in a field made with ``enter_moves_on``: a dialog's reason, after which come the
buttons), and a key (or a paste) that reaches the field after the focus left it goes
on to the widget that has the focus by then.
"""

from __future__ import annotations

from typing import Any

from textual import events
from textual.widgets import Input


class TextField(Input):
    """An ``Input`` whose tab moves on in order, and that passes on what came after it."""

    def __init__(self, *args: Any, enter_moves_on: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.enter_moves_on = enter_moves_on

    def _moved_on(self) -> bool:
        focused = self.screen.focused
        return focused is not None and focused is not self

    async def _on_key(self, event: events.Key) -> None:
        if self._moved_on():
            event.stop()
            event.prevent_default()
            self._pass_on(events.Key(event.key, event.character))
            return
        if event.key in ("tab", "shift+tab") or (event.key == "enter" and self.enter_moves_on):
            event.stop()
            event.prevent_default()
            if event.key != "shift+tab":
                self.screen.focus_next()
            else:
                self.screen.focus_previous()
        # Otherwise ``Input._on_key`` runs next (Textual calls each class's handler).

    def _on_paste(self, event: events.Paste) -> None:
        if self._moved_on():
            event.stop()
            event.prevent_default()  # not ``Input._on_paste`` too
            self._pass_on(events.Paste(event.text))

    def _pass_on(self, event: events.Key | events.Paste) -> None:
        focused = self.screen.focused
        if focused is not None:
            # As the app delivers input: marked forwarded, so it is not routed twice.
            focused._forward_event(event)
