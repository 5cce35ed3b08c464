"""A DataTable whose text cells are shown exactly as written.

DataTable reads a ``str`` cell as console markup: an aggregate id ``[/oops]`` raised
MarkupError while the table drew its row (the console crashed), and ``[b]7`` lost its
brackets. Producers choose ids, tenants, types and error messages, so every table that
shows them takes its ``str`` cells as plain text. Parsing markup was also a good part of
the cost of drawing a fresh page; the rest was Rich drawing each cell, which
``plain_cell_lines`` does for the one-line plain cells these tables hold (decision 0032).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import CellType, ColumnKey, RowKey

from outbox_tui.safe_text import printable
from outbox_tui.widgets.plain_cell import plain_cell_lines


def text_width(text: Text) -> int:
    """What Rich measures as a text's widest line (``Measurement.maximum``)."""
    return max((cell_len(line) for line in text.plain.splitlines()), default=0)


def literal(value: Any) -> Any:
    """``value`` as plain text when it is a ``str`` (one line, as DataTable makes a ``str``
    of a one-line row; control characters spelled out); anything else as it is."""
    return Text(printable(value), no_wrap=True, end="") if isinstance(value, str) else value


class LiteralTable(DataTable[CellType]):
    """``add_row`` and ``update_cell`` take ``str`` cells as plain text, never as markup."""

    def add_row(self, *cells: CellType, **kwargs: Any) -> RowKey:
        return super().add_row(*(literal(c) for c in cells), **kwargs)

    def update_cell(
        self, row_key: RowKey | str, column_key: ColumnKey | str, value: CellType, **kwargs: Any
    ) -> None:
        super().update_cell(row_key, column_key, literal(value), **kwargs)

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        """Column widths of new unlabelled one-line rows of text cells, measured here.

        DataTable measures each cell of a new row through ``console.options``, which
        Rich builds anew for each call, and a page has hundreds of cells (see decision
        0032). A text's width is its widest line's cell length; other rows (labels, auto
        height, other renderables) are DataTable's to measure.
        """
        others = []
        columns = self.ordered_columns
        for row_key in new_rows:
            row_index = self._row_locations.get(row_key)
            row = self.rows.get(row_key)
            if row_index is None or row is None:
                continue  # removed before the table measured it
            _label, cells = self._get_row_renderables(row_index)
            texts = [cell for cell in cells if isinstance(cell, Text)]
            if row.label is not None or row.auto_height or len(texts) != len(cells):
                others.append(row_key)
                continue
            for column, text in zip(columns, texts, strict=False):  # as DataTable pairs them
                width = text_width(text)
                if width > column.content_width:
                    column.content_width = width
        super()._update_dimensions(others)

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> list[list[Segment]]:
        drawn = self._plain_cell(row_index, column_index, base_style, width, cursor, hover)
        if drawn is not None:
            return drawn
        return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)

    def _plain_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool,
        hover: bool,
    ) -> list[list[Segment]] | None:
        """A body cell of one line of plain text, styled as ``DataTable._render_cell`` styles
        it (row and column in its meta, for the mouse); None for any other cell."""
        if row_index < 0 or column_index < 0:  # the header and row labels
            return None
        row_key = self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        if row_key is None or column_key is None:
            return None
        value = self._data.get(row_key, {}).get(column_key)
        row = self.rows.get(row_key)
        if not isinstance(value, Text) or row is None or row.height != 1:
            return None
        component_style, post_style = self._get_styles_to_render_cell(
            False,
            False,
            row_index < self.fixed_rows or column_index < self.fixed_columns,
            hover,
            cursor,
            self.show_cursor,
            self._show_hover_cursor,
            self.cursor_foreground_priority == "css",
            self.cursor_background_priority == "css",
        )
        pre_style = base_style + Style.from_meta({"row": row_index, "column": column_index})
        return plain_cell_lines(
            value,
            width,
            self.cell_padding,
            pre_style + component_style,
            post_style,
            self.app.console.get_style,
        )
