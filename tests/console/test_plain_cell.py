"""The console's own drawing of table cells and lines is Rich's and DataTable's, only cheaper."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult
from textual.renderables.styled import Styled
from textual.widgets import DataTable

from engine.operating.event_views import EventSummary
from outbox_tui.widgets.event_table import EventTable
from outbox_tui.widgets.literal_table import LiteralTable, text_width
from outbox_tui.widgets.plain_cell import plain_cell_lines

from .conftest import until

CHARS = "abc xyz-:./0123 "
ODD = ["é", "—", "…", "·", "日", "e\u0301", "\t", "\n", "\x1b"]
TEXT_STYLES = [Style(), Style(color="red"), Style(bold=True, bgcolor="blue"), Style(dim=True)]
NAMED_STYLES = ["", "bold", "#8a8a8a", "none", "repr.number", "red on blue"]
# DataTable's pre style always carries the cell's row and column (for the mouse).
PRE_STYLES = [
    Style(bgcolor="#202020") + Style.from_meta({"row": 1, "column": 2}),
    Style(color="white", bgcolor="black"),
]
POST_STYLES = [Style(), Style(bgcolor="yellow"), Style(color="green")]


def _segments(lines: list[list[Segment]]) -> list[list[tuple[str, Style | None]]]:
    return [[(s.text, s.style) for s in Segment.simplify(line) if s.text] for line in lines]


def test_a_plain_cell_draws_as_rich_draws_it_or_is_left_to_rich():
    console = Console(width=200, force_terminal=True, color_system="truecolor")
    rng = random.Random(20261202)
    drawn_here = 0
    for _ in range(6000):
        plain = "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 30)))
        if rng.random() < 0.15:
            plain += rng.choice(ODD)
        style = rng.choice(TEXT_STYLES) if rng.random() < 0.6 else rng.choice(NAMED_STYLES)
        cell = Text(
            plain,
            style=style,
            no_wrap=True,
            end="",
            justify=rng.choice([None, "left", "default", "right", "center"]),
            overflow=rng.choice([None, "fold", "crop", "ellipsis"]),
        )
        width, padding = rng.randint(1, 25), rng.choice([0, 1, 2])
        pre, post = rng.choice(PRE_STYLES), rng.choice(POST_STYLES)
        options = console.options.update_dimensions(width, 1).update(no_wrap=True)
        expected = console.render_lines(
            Styled(Padding(cell, (0, padding)), pre_style=pre, post_style=post), options
        )
        got = plain_cell_lines(cell, width, padding, pre, post, console.get_style)
        if got is None:
            continue
        drawn_here += 1
        assert _segments(got) == _segments(expected), (plain, width, padding, cell.justify)
    assert drawn_here > 2500  # the common cells are drawn here, not left to Rich


@pytest.mark.parametrize(
    "cell",
    [
        Text("日本語", no_wrap=True),  # two cells a character
        Text("e\u0301", no_wrap=True),  # a combining accent takes no cell
        Text("a\tb", no_wrap=True),
        Text("two\nlines"),
        Text("right", justify="right"),
        Text.assemble(("id", "bold"), " rest"),  # spans
    ],
)
def test_cells_only_rich_can_draw_are_left_to_it(cell):
    console = Console()
    assert plain_cell_lines(cell, 12, 1, Style(), Style(), console.get_style) is None


ROWS = [
    ["orders.placed v1", "—", "acme", "a much longer aggregate id than the others"],
    ["x", "[/oops]", "日本語日本語", "日本"],  # the widest of its column: 12 cells, 6 characters
    ["", "3/10\n4", "t", "e\u0301"],  # a line break in a one-line row: the widest line counts
]


def measured(table: DataTable) -> bool:
    """Each column as wide as its widest cell. DataTable measures new rows when it is next
    idle; until then a column is only as wide as its label, and a row drawn then stays cut
    (DataTable caches it), so a test reads no line before this."""

    def width(cell: object) -> int:
        return text_width(cell) if isinstance(cell, Text) else cell_len(str(cell))

    return all(
        column.content_width >= max(map(width, table.get_column(column.key)), default=0)
        for column in table.ordered_columns
    )


class Tables(App[None]):
    def compose(self) -> ComposeResult:
        yield LiteralTable(id="literal")
        yield DataTable(id="plain")


async def test_column_widths_are_datatables_own():
    app = Tables()
    async with app.run_test(size=(160, 20)) as pilot:
        for table_id in ("#literal", "#plain"):
            table = app.query_one(table_id, DataTable)
            table.add_columns("a", "b", "c", "d")
            for row in ROWS:  # as Text, which DataTable measures itself
                table.add_row(*(Text(v, no_wrap=True, end="") for v in row))
            table.add_row(Text("second\nline"), "x", "y", "z", height=2)  # DataTable measures it
        literal = app.query_one("#literal", DataTable)
        plain = app.query_one("#plain", DataTable)
        await until(pilot, lambda: measured(literal) and measured(plain), "the rows measured")
        assert [c.content_width for c in literal.ordered_columns] == [
            c.content_width for c in plain.ordered_columns
        ]
        assert literal.virtual_size == plain.virtual_size


NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _event(n: int, status: str = "pending") -> EventSummary:
    return EventSummary(
        id=f"0193a1b2-0000-7000-8000-{n:012d}",
        status=status,
        event_type="orders.placed",
        event_version=1,
        tenant_id="acme",
        aggregate_type="order",
        aggregate_id=str(n),
        attempt_count=0,
        max_attempts=10,
        next_retry_at=None,
        created_at=NOW - timedelta(minutes=n),
        last_error=None,
        dead_letter_reason=None,
        replay_count=0,
    )


class Events(App[None]):
    def compose(self) -> ComposeResult:
        yield EventTable()


def _screen_line(table: EventTable, event_id: str) -> str:
    y = table.get_row_index(event_id) + 1  # under the header
    return table.render_line(y).text


async def test_a_refreshed_row_draws_its_new_cells_and_the_others_stay():
    app = Events()
    async with app.run_test(size=(160, 20)) as pilot:
        table = app.query_one(EventTable)
        events = [_event(n) for n in range(5)]
        table.show("all", events, NOW)
        await until(pilot, lambda: measured(table), "the rows measured")
        before = {e.id: _screen_line(table, e.id) for e in events}
        failed = replace(events[2], status="failed", attempt_count=3, last_error="timeout")
        table.show("all", [*events[:2], failed, *events[3:]], NOW)

        def changed_drawn() -> bool:
            if not measured(table):  # the changed cells may widen their columns
                return False
            line = _screen_line(table, failed.id)
            return "3/10" in line and "timeout" in line

        await until(pilot, changed_drawn, "the changed row drawn")
        changed = _screen_line(table, failed.id)
        assert "3/10" in changed and "timeout" in changed and changed != before[failed.id]
        for e in events:
            if e.id != failed.id:
                assert _screen_line(table, e.id) == before[e.id]
        looks = {y: [seg.style for seg in table.render_line(y)] for y in (1, 3)}
        table.move_cursor(row=2)  # the highlight moves from row 0 (y 1) to row 2 (y 3)
        await until(
            pilot,
            lambda: all(
                [s.style for s in table.render_line(y)] != look for y, look in looks.items()
            ),
            "the highlight to move",
        )
        for y, look in looks.items():
            assert [seg.style for seg in table.render_line(y)] != look
