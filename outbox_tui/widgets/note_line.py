"""A one-line note under the header, in the longest wording that fits (the demo's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.widgets import Static


class NoteLine(Static):
    """Shows the first of ``variants`` (longest first) that fits its width, never cut."""

    def __init__(self, variants: Sequence[str], **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.variants = tuple(variants)
        self.display = bool(self.variants)

    def render(self) -> Text:
        width = self.content_size.width
        fitting = (v for v in self.variants if len(v) <= width)
        return Text(next(fitting, self.variants[-1] if self.variants else ""), no_wrap=True)
