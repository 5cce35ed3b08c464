"""Which type is hurting: the event types with the most undelivered events, by status.

The counts are ``OutboxInsights.top_types``, the same numbers ``stats --json`` lists
under ``top_types``, fetched by the refresh. Two shapes:

- ``TopTypesLine``: one line for narrow or short terminals, as many types as fit;
- ``TopTypesPanel``: a boxed table (type, pending, publishing, failed, dead, total)
  for wide, tall terminals.

Counts are never cut: a column is as wide as its widest number (abbreviated past five
digits), and the type name is what gets shortened.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import Static

from engine.operating.insights import TypeCounts
from outbox_tui.widgets.format import RICH_STATUS_STYLES, compact, fitted, one_line

MUTED = "#8a8a8a"
# (status, column header, the word in the one-line form)
COLUMNS = (
    ("pending", "pending", "pending"),
    ("publishing", "publishing", "publishing"),
    ("failed", "failed", "failed"),
    ("dead_letter", "dead", "dead"),
)
NUMBER_WIDTH = 5  # compact() never needs more


def _breakdown(counts: TypeCounts) -> Text:
    parts = [
        Text.assemble((compact(counts.counts.get(status, 0)), RICH_STATUS_STYLES[status]), f" {w}")
        for status, _header, w in COLUMNS
        if counts.counts.get(status, 0)
    ]
    return Text(", ", style=MUTED).join(parts)


def _entry(counts: TypeCounts, *, detail: bool, name_width: int | None = None) -> Text:
    name = counts.event_type if name_width is None else one_line(counts.event_type, name_width)
    entry = Text.assemble((name, "bold"), " ", (compact(counts.undelivered), "bold"))
    if detail and counts.undelivered:
        entry.append(" (", style=MUTED)
        entry.append_text(_breakdown(counts))
        entry.append(")", style=MUTED)
    return entry


def top_types_line(types: Sequence[TypeCounts], width: int) -> Text:
    """``top types  orders.placed 27 (10 pending, 8 failed, 9 dead)  ·  orders.cancelled 4``.

    The first variant that fits: every type with its breakdown, then fewer, then the
    first with its breakdown and the rest as totals, then totals only, and last the
    first type alone with its name shortened.
    """
    label = Text("top types  ", style=MUTED)
    busy = [t for t in types if t.undelivered]
    if not busy:
        return Text.assemble(label, ("nothing undelivered", MUTED))
    gap = Text("  ·  ", style=MUTED)
    for shape in ("all", "first", "totals"):
        for n in range(len(busy), 0, -1):
            entries = [
                _entry(t, detail=shape == "all" or (shape == "first" and i == 0))
                for i, t in enumerate(busy[:n])
            ]
            line = Text.assemble(label, gap.join(entries), no_wrap=True)
            if line.cell_len <= width:
                return line
    first = busy[0]
    room = max(1, width - label.cell_len - 1 - len(compact(first.undelivered)))
    return Text.assemble(label, _entry(first, detail=False, name_width=room), no_wrap=True)


def top_types_table(types: Sequence[TypeCounts], width: int, rows: int) -> Text:
    """A header and up to ``rows`` types; the numeric columns are never narrowed."""
    if not types:
        return Text("nothing undelivered", style=MUTED)
    shown = list(types)[: max(1, rows)]
    widths = [
        max(len(header), *(len(fitted(t.counts.get(s, 0), NUMBER_WIDTH)) for t in shown))
        for s, header, _word in COLUMNS
    ]
    total_width = max(5, *(len(fitted(t.undelivered, NUMBER_WIDTH)) for t in shown))
    numbers = sum(w + 2 for w in widths) + total_width + 2
    name_width = max(4, width - numbers)
    header = Text(f"{'type':<{name_width}}", style=MUTED, no_wrap=True)
    for (_s, title, _w), w in zip(COLUMNS, widths, strict=True):
        header.append(f"  {title:>{w}}", style=MUTED)
    header.append(f"  {'total':>{total_width}}", style=MUTED)
    lines = [header]
    for counts in shown:
        row = Text(f"{one_line(counts.event_type, name_width):<{name_width}}", no_wrap=True)
        for (status, _title, _w), w in zip(COLUMNS, widths, strict=True):
            value = counts.counts.get(status, 0)
            style = RICH_STATUS_STYLES[status] if value else MUTED
            row.append(f"  {fitted(value, NUMBER_WIDTH):>{w}}", style=style)
        row.append(f"  {fitted(counts.undelivered, NUMBER_WIDTH):>{total_width}}", style="bold")
        lines.append(row)
    return Text("\n", no_wrap=True).join(lines)


class TopTypesLine(Static):
    """The top types in one line."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.types: Sequence[TypeCounts] = ()
        self.loaded = False

    def show(self, types: Sequence[TypeCounts]) -> None:
        self.types, self.loaded = tuple(types), True
        self.refresh()

    def render(self) -> Text:
        if not self.loaded:
            return Text("top types: waiting for the first refresh…", style=MUTED)
        return top_types_line(self.types, self.content_size.width)


class TopTypesPanel(Static):
    """The top types as a small table in a box."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.types: Sequence[TypeCounts] = ()
        self.border_title = "top types · undelivered by status"

    def show(self, types: Sequence[TypeCounts]) -> None:
        self.types = tuple(types)
        self.refresh()

    def render(self) -> Text:
        size = self.content_size
        return top_types_table(self.types, size.width, max(1, size.height - 1))
