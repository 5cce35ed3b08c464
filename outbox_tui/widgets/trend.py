"""The overview's slot for the trend: a one-line verdict and a sparkline row.

Empty and hidden until something calls ``show``: the engine side (issue 12, part 4:
``engine/trends.py``) is not wired in yet. The next step is for ``MainScreen._apply_poll``
to pass the snapshot's trend here, and for styles.tcss to give ``#overview`` the row
(``#trend`` is one line: verdict, then the backlog sparkline on the right).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import Static

BLOCKS = "▁▂▃▄▅▆▇█"
MUTED = "#8a8a8a"


def one_row_sparkline(values: Sequence[float], width: int) -> Text:
    """One row of blocks, newest on the right, scaled to the largest value."""
    values = list(values)[-width:] if width > 0 else []
    peak = max(values, default=0) or 1
    line = Text(style="#5fafff")
    for value in values:
        line.append(BLOCKS[min(7, max(0, round(7 * value / peak)))])
    return line


class TrendLine(Static):
    """``draining, empty in about 3m   ▁▂▃▅▇``; hidden while there is no verdict."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__("", **kwargs)  # type: ignore[arg-type]
        self.display = False

    def show(self, verdict: str | None, backlog: Sequence[float] = ()) -> None:
        """Show ``verdict`` with the backlog's sparkline; None hides the line again."""
        self.display = verdict is not None
        if verdict is None:
            return
        room = max(0, self.content_size.width - len(verdict) - 3)
        self.update(Text.assemble((verdict, "bold"), "   ", one_row_sparkline(backlog, room)))
