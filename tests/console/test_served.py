"""The dispatcher panel says which types each dispatcher serves, and which types no live
dispatcher serves with their count and age, within the terminal's width (issue 9)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from textual.content import Content
from textual.widgets import DataTable

from engine import create_engine
from engine.operating.insights import HeartbeatView, UnservedType
from engine.running.heartbeat import Heartbeat
from outbox_tui.widgets.dispatchers import DispatchersPanel, plan_columns, unserved_note
from outbox_tui.widgets.format import served_types

from .conftest import console, refreshed, started, until

ORDERS = ["orders.placed", "orders.cancelled"]


def unserved(event_type: str, n: int, age: float) -> UnservedType:
    return UnservedType(event_type, n, datetime(2026, 1, 1, tzinfo=UTC), age)


@pytest.mark.parametrize(
    ("width", "text"),
    [
        (60, "orders.placed, orders.cancelled, billing.invoiced"),
        (40, "orders.placed, … (3 types)"),
        (20, "3 types"),
        (8, "3 types"),
    ],
)
def test_served_types_shorten_to_the_room(width, text):
    types = ["orders.placed", "orders.cancelled", "billing.invoiced"]
    assert served_types(types, width) == text
    assert len(text) <= max(width, 8)


def test_served_types_of_one_none_or_an_earlier_version():
    assert served_types(["orders.placed"], 40) == "orders.placed"
    assert served_types(["orders.placed"], 8) == "orders.…"
    assert served_types([], 40) == "nothing"
    assert served_types(None, 40) == "—"  # a dispatcher from before "serves": every type


def test_the_unserved_note_gives_type_count_and_age_within_the_width():
    waiting = [unserved("billing.invoiced", 2, 252), unserved("audit.logged", 1204, 11100)]
    wide = unserved_note(waiting, 120)
    assert wide == "billing.invoiced (2, oldest 4m 12s), audit.logged (1,204, oldest 3h 05m)"
    # 80 columns: the bottom border has 76 cells for "no dispatcher serves " and the note.
    at_80 = unserved_note(waiting, 76)
    assert at_80 == "billing.invoiced (2, oldest 4m 12s) +1 more"
    assert len("no dispatcher serves " + at_80) <= 76
    assert unserved_note(waiting, 50) == "2 types (1,206 events, oldest 3h 05m)"
    assert unserved_note([unserved("a", 123456, 5)], 76, narrow=True) == "a (123k, oldest 5s)"


def view(instance_id: str, serves: list[str] | None, host: str = "orders-1", pid: int = 42):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    details = {} if serves is None else {"serves": serves}
    return HeartbeatView(instance_id, "dispatcher", host, pid, "alive", now, now, 1.0, details)


def test_the_serves_column_takes_the_room_the_others_leave():
    at_80 = 78  # the panel's table inside its border on an 80-column terminal
    named = [view("orders-1:42", ["orders.placed"]), view("reports-1:43", ["a"], "reports-1", 43)]
    layout = plan_columns(at_80, named)
    assert layout.narrow and layout.serves_room is not None and layout.serves_room >= 8
    keys = [key for key, _label in layout.columns]
    assert "where" not in keys and keys[-1] == "serves"  # host:pid repeats the instance id
    # Instance ids of their own keep host:pid; with no room left, serves is left out.
    own = [view("orders-worker-1", ["orders.placed"]), view("reports-worker-17", ["a"])]
    layout = plan_columns(at_80, own)
    assert layout.narrow and layout.serves_room is None
    assert "where" in [key for key, _label in layout.columns]
    wide = plan_columns(158, own)  # 47: the "dead-lettered" header took two cells more
    assert not wide.narrow and wide.serves_room == 47
    assert plan_columns(170, own).serves_room == 48  # the most it takes
    assert [key for key, _label in wide.columns][-1] == "serves"
    # No heartbeat says what it serves (dispatchers of an earlier version): no column.
    assert plan_columns(158, [view("old", None)]).serves_room is None


async def _beat(url: str, host: str, pid: int, serves: list[str] | None) -> None:
    """A heartbeat with the default instance id, host:pid."""
    engine = create_engine(url)
    try:
        details: dict[str, object] = {"iterations": 3}
        if serves is not None:
            details["serves"] = serves
        beat = Heartbeat(engine, f"{host}:{pid}", host=host, pid=pid)
        await beat.beat(details, force=True)
    finally:
        await engine.dispose()


def subtitle(panel: DispatchersPanel) -> str:
    """The bottom border's text, without its markup."""
    return Content.from_markup(panel.border_subtitle or "").plain


def _panel_text(panel: DispatchersPanel) -> tuple[list[str], list[list[str]]]:
    table = panel.query_one(DataTable)
    keys = [str(c.key.value) for c in table.ordered_columns]
    rows = [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]
    return keys, rows


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_the_panel_shows_what_each_dispatcher_serves_and_what_waits_unserved(
    sqlite_seeded, orders_registry, size
):
    many = [f"service.type-{i:02}" for i in range(12)]
    await _beat(sqlite_seeded, "orders-1", 4242, ["orders.placed"])
    await _beat(sqlite_seeded, "reports-1", 5150, many)
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=size) as pilot:
        await started(pilot)
        await refreshed(pilot)
        panel = app.main.query_one(DispatchersPanel)
        keys, rows = _panel_text(panel)
        assert keys[-1] == "serves"
        served = {row[0]: row[-1] for row in rows}
        assert served["orders-1:4242"] == "orders.placed"
        wanted = "12 types" if size[0] == 80 else "service.type-00, service.type-01, … (12 types)"
        assert served["reports-1:5150"] == wanted
        table = panel.query_one(DataTable)
        used = sum(c.get_render_width(table) for c in table.ordered_columns)
        assert used <= panel.size.width, (used, panel.size.width)

        # orders.cancelled waits (no live dispatcher serves it): type, count and age.
        note = subtitle(panel)
        assert note.startswith("no dispatcher serves orders.cancelled ("), note
        assert ", oldest " in note and note.endswith(")"), note
        assert len(note) <= panel.outer_size.width - 4


async def test_no_serves_column_while_no_heartbeat_says_what_it_serves(
    sqlite_seeded, orders_registry
):
    await _beat(sqlite_seeded, "old-worker", 1, None)  # an earlier version: claims every type
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=(160, 45)) as pilot:
        await started(pilot)
        await refreshed(pilot)
        panel = app.main.query_one(DispatchersPanel)
        keys, _rows = _panel_text(panel)
        assert "serves" not in keys
        assert not panel.border_subtitle  # unserved is judged only when all say

        await _beat(sqlite_seeded, "new-worker", 2, ORDERS)
        await refreshed(pilot)
        keys, rows = _panel_text(panel)
        assert keys[-1] == "serves"
        assert {r[0]: r[-1] for r in rows} == {
            "old-worker:1": "—",
            "new-worker:2": "orders.placed, orders.cancelled",
        }


async def test_the_note_is_cut_anew_when_the_terminal_narrows(sqlite_seeded, orders_registry):
    await _beat(sqlite_seeded, "orders-1", 4242, [])
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=(160, 45)) as pilot:
        await started(pilot)
        await refreshed(pilot)
        panel = app.main.query_one(DispatchersPanel)
        await until(
            pilot,
            lambda: all(f"{t} (" in subtitle(panel) for t in ORDERS),
            "the note at 160 columns",
        )
        wide = subtitle(panel)
        assert "orders.placed (" in wide and "orders.cancelled (" in wide, wide
        await pilot.resize_terminal(80, 24)
        await until(
            pilot,
            lambda: (
                panel.outer_size.width <= 80 and len(subtitle(panel)) <= panel.outer_size.width - 4
            ),
            "the note to be cut anew for 80 columns",
        )
        narrow = subtitle(panel)
        assert len(narrow) <= panel.outer_size.width - 4, narrow
        assert "oldest" in narrow, narrow
