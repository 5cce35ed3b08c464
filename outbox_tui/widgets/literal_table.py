"""A DataTable whose text cells are shown exactly as written.

DataTable reads a ``str`` cell as console markup: an aggregate id ``[/oops]`` raised
MarkupError while the table drew its row (the console crashed), and ``[b]7`` lost its
brackets. Producers choose ids, tenants, types and error messages, so every table that
shows them takes its ``str`` cells as plain text. Parsing markup was also a good part of
the cost of drawing a fresh page.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import CellType, ColumnKey, RowKey


def literal(value: Any) -> Any:
    """``value`` as plain text when it is a ``str`` (one line, as DataTable makes a ``str``
    of a one-line row); anything else as it is."""
    return Text(value, no_wrap=True, end="") if isinstance(value, str) else value


class LiteralTable(DataTable[CellType]):
    """``add_row`` and ``update_cell`` take ``str`` cells as plain text, never as markup."""

    def add_row(self, *cells: CellType, **kwargs: Any) -> RowKey:
        return super().add_row(*(literal(c) for c in cells), **kwargs)

    def update_cell(
        self, row_key: RowKey | str, column_key: ColumnKey | str, value: CellType, **kwargs: Any
    ) -> None:
        super().update_cell(row_key, column_key, literal(value), **kwargs)
