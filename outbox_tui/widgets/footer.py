"""The console's footer: Textual's, compact, and showing fewer keys on narrow terminals.

A key whose row in the action table (``outbox_tui.actions``) has ``footer_from``
is hidden below that width, and the command palette's hint below
``PALETTE_HINT_FROM``: at 80 columns the footer shows the incident keys whole
rather than every key cut off at the edge. The help (``?``) and the palette
(``ctrl+p``) list every key at every width.
"""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from outbox_tui.actions import FOOTER_WIDTHS, PALETTE_HINT_FROM, footer_widths

_WIDTHS = footer_widths()


class ConsoleFooter(Footer):
    """Compact; each key tagged ``-from-N`` when it needs N columns (the CSS hides it)."""

    def __init__(self) -> None:
        super().__init__(compact=True)

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            if isinstance(widget, FooterKey):
                if widget.has_class("-command-palette"):
                    widget.add_class(f"-from-{PALETTE_HINT_FROM}")
                elif widget.action in _WIDTHS:
                    widget.add_class(f"-from-{_WIDTHS[widget.action]}")
            yield widget

    def on_mount(self) -> None:
        self._fit(self.app.size.width)

    def on_resize(self, event: events.Resize) -> None:
        self._fit(event.size.width)

    def _fit(self, width: int) -> None:
        for tier in FOOTER_WIDTHS:
            self.set_class(width < tier, f"-below-{tier}")
