"""Drawing a one-line plain-text table cell without Rich's render pipeline.

DataTable draws every cell through ``console.render_lines(Styled(Padding(cell)))``, so
drawing a fresh page held the event loop for its hundreds of cells (the "older page"
stall of benchmarks/console_million_rows.py, decision 0032). Almost every cell the
console shows is one line of plain printable text with one style, for which the result is
known: the padding, the text cropped (or ended with an ellipsis) to the column, the rest
filled. ``plain_cell_lines`` builds exactly those segments and says ``None`` for anything
else (spans, wide or control characters, centred or right-justified text), which Rich then
draws as before.
tests/console/test_plain_cell.py holds it to Rich's output, segment style by segment style.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

__all__ = ["plain_cell_lines"]

_NULL = Style.null()


def _styled(style: Style | None, pre: Style | None, post: Style | None) -> Style | None:
    """``Segment.apply_style(pre, post)`` for one segment, as ``Styled`` applies them."""
    if pre:
        style = pre + style
    if post:
        style = style + post if style else post
    return style


def plain_cell_lines(
    cell: Text,
    width: int,
    padding: int,
    pre_style: Style | None,
    post_style: Style | None,
    get_style: Callable[[str], Style],
) -> list[list[Segment]] | None:
    """The one line ``DataTable`` would draw for ``cell`` in a column ``width`` cells wide
    (``padding`` on each side), or ``None`` when only Rich can say.

    ``get_style`` is the console's (a style by name is looked up as Rich looks it up).
    The console options DataTable draws with (``App.console_options``) set neither
    justify nor overflow, so a text that sets none gets Rich's defaults.
    """
    plain = cell.plain
    inner = width - 2 * padding
    if inner < 1 or cell.spans or not plain.isprintable():
        return None
    if not plain.isascii() and cell_len(plain) != len(plain):  # wide or zero-width
        return None
    style: Style | str | None = cell.style
    if isinstance(style, str) and style:
        style = get_style(style)
    style = style or None  # Rich's Text.join gives no span to a text without a style
    method = cell.justify or "default"
    if method not in ("default", "left"):
        return None
    cut = cell.overflow or "fold"
    if cut == "ignore":
        return None
    if len(plain) > inner:
        plain = plain[: inner - 1] + "…" if cut == "ellipsis" else plain[:inner]
    fill = inner - len(plain)
    blank = _styled(_NULL, pre_style, post_style)
    line = []
    if padding:
        line.append(Segment(" " * padding, blank))
    if method == "left":  # Rich pads the text itself, in the text's style
        plain += " " * fill
        fill = 0
    if plain:
        line.append(Segment(plain, _styled(style, pre_style, post_style)))
    if fill:
        line.append(Segment(" " * fill, blank))
    if padding:
        line.append(Segment(" " * padding, blank))
    return [line]
