"""Views, keyset paging, the detail pane, help and the command palette, from the keyboard."""

from __future__ import annotations

import io
import json

from rich.console import Console

from engine import create_engine
from engine.operating.insights import EventFilter, OutboxInsights
from outbox_tui.screens.help import HelpScreen
from outbox_tui.widgets.event_detail import EventDetailPane, render_detail
from outbox_tui.widgets.event_table import EventTable
from outbox_tui.widgets.overview import CountTile

from .conftest import SIZE, console, palette_offers, press_to_exit, refreshed, started, until


def table_ids(app) -> list[str]:
    return [e.id for e in app.main.query_one(EventTable).events]


async def expected_ids(url: str, flt: EventFilter | None = None, **kw) -> list[str]:
    engine = create_engine(url)
    try:
        page = await OutboxInsights(engine).events_page(flt, **kw)
        return [e.id for e in page.events]
    finally:
        await engine.dispose()


async def test_overview_and_views_switch_with_e_and_d(seeded_url, orders_registry):
    app = console(seeded_url, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        snap = app.main.last_snapshot
        assert snap is not None and snap.counts["dead_letter"] > 0
        tile = app.main.query_one("#tile-dead_letter", CountTile)
        assert str(snap.counts["dead_letter"]) in str(tile.render())
        assert table_ids(app) == await expected_ids(seeded_url, limit=100)

        await pilot.press("d")
        await until(pilot, lambda: app.main.query_one(EventTable).mode == "dead_letters", "d")
        dead = await expected_ids(seeded_url, EventFilter(statuses=("dead_letter",)), limit=100)
        assert table_ids(app) == dead
        assert all(e.status == "dead_letter" for e in app.main.query_one(EventTable).events)

        await pilot.press("e")
        await until(pilot, lambda: app.main.query_one(EventTable).mode == "events", "e")
        assert len(table_ids(app)) == sum(snap.counts.values())


async def test_keyset_pages_with_brackets(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry, page_size=10)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        first = table_ids(app)
        assert first == await expected_ids(sqlite_seeded, limit=10)
        await pilot.press("left_square_bracket")  # no newer page: nothing happens
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: table_ids(app) != first, "the older page")
        second = table_ids(app)
        assert second == await expected_ids(sqlite_seeded, limit=10, before=first[-1])
        assert app.main.view.page_number == 2
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: app.main.view.page_number == 3, "the third page")
        await pilot.press("left_square_bracket")
        await until(pilot, lambda: table_ids(app) == second, "back to page 2")
        await pilot.press("home")
        await until(pilot, lambda: table_ids(app) == first, "back to the newest page")


async def test_enter_opens_detail_that_follows_the_cursor(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        pane = app.main.query_one(EventDetailPane)
        table = app.main.query_one(EventTable)
        assert not pane.display or not app.main.detail_open
        await pilot.press("enter")
        first = table.highlighted.id
        await until(pilot, lambda: pane.event_id == first, "the detail of the first row")
        await until(pilot, lambda: pane.region.width > 0, "the detail pane on screen")
        assert pane.region.width > 0
        await pilot.press("down")
        second = table.highlighted.id
        await until(pilot, lambda: pane.event_id == second, "the detail to follow the cursor")
        await pilot.press("escape")
        await until(
            pilot,
            lambda: not app.main.detail_open and pane.region.width == 0,
            "the detail pane to close",
        )
        assert not app.main.detail_open and pane.region.width == 0


async def test_dead_letter_detail_shows_reason_payload_and_handler_runs(
    sqlite_seeded, orders_registry
):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("d")
        await until(pilot, lambda: app.main.query_one(EventTable).mode == "dead_letters", "d")
        await pilot.press("enter")
        pane = app.main.query_one(EventDetailPane)
        event = app.main.query_one(EventTable).highlighted
        await until(pilot, lambda: pane.event_id == event.id, "the detail")
        detail = await app.insights.event_detail(event.id)
        out = Console(width=100, record=True, file=io.StringIO())
        out.print(render_detail(detail, app.clock()))
        text = out.export_text()
        for expected in (
            event.id,
            "dead-letter reason",
            "exceeds the credit limit",
            '"amount"',
            "orders.reserve_stock",
            "claim version",
            "lease",
            "trace id",
            "Handler runs (1)",
        ):
            assert expected in text, expected


async def test_refresh_picks_up_new_rows_and_keeps_the_cursor(sqlite_seeded, orders_registry):
    from outbox_tui.examples.orders.traffic import generate_orders

    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("down", "down")
        table = app.main.query_one(EventTable)
        kept = table.highlighted.id
        expected_before = table_ids(app)
        engine = create_engine(sqlite_seeded)
        try:
            await generate_orders(engine, orders_registry, 2, seed=99, cancel_every=0)
        finally:
            await engine.dispose()
        total_before = len(table_ids(app))
        await refreshed(pilot)
        assert len(table_ids(app)) == total_before + 2
        assert table.highlighted.id == kept  # the operator's row, not the same position

        await pilot.press("home")  # on the first row the cursor follows the newest event
        engine = create_engine(sqlite_seeded)
        try:
            await generate_orders(engine, orders_registry, 1, seed=98, cancel_every=0)
        finally:
            await engine.dispose()
        await refreshed(pilot)
        assert table.cursor_row == 0 and table.highlighted.id == table_ids(app)[0]
        assert table.highlighted.id not in (kept, *expected_before)


async def test_help_screen_and_command_palette(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert app.screen is app.main

        await pilot.press("ctrl+p")
        await until(pilot, lambda: app.screen is not app.main, "the palette")
        await palette_offers(pilot, "dead", "Show dead letters")
        await pilot.press("enter")
        await until(pilot, lambda: app.main.mode == "dead_letters", "the palette command")


async def test_polling_pauses_while_a_dialog_is_open(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry, refresh_seconds=0.15)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await until(pilot, lambda: app.main.refreshes >= 2, "timed refreshes")
        await pilot.press("question_mark")
        paused_at = app.main.refreshes
        await pilot.pause(0.5)
        assert app.main.refreshes <= paused_at + 1  # at most the poll already in flight
        await pilot.press("escape")
        await until(pilot, lambda: app.main.refreshes > paused_at + 1, "polling to resume")


async def test_q_quits(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await press_to_exit(pilot, "q")
    assert app.return_code == 0


def test_a_payload_too_deep_for_the_tree_view_is_named_not_fatal():
    """A payload can decode and still nest too deeply to indent on the console's stack."""
    from datetime import UTC, datetime

    from engine.operating.event_views import EventDetail

    deep = json.loads("[" * 850 + "]" * 850)
    detail = EventDetail({"id": "e-1", "status": "pending"}, {"deep": deep}, None)

    def rendered_at_depth(frames: int) -> str:
        if frames:
            return rendered_at_depth(frames - 1)
        out = Console(width=100, record=True, file=io.StringIO())
        out.print(render_detail(detail, datetime.now(UTC)))
        return out.export_text()

    assert "payload nested too deeply to show as a tree" in rendered_at_depth(200)
    shallow = EventDetail({"id": "e-2", "status": "pending"}, {"deep": [[1]]}, None)
    out = Console(width=100, record=True, file=io.StringIO())
    out.print(render_detail(shallow, datetime.now(UTC)))
    assert '"deep"' in out.export_text()


async def test_at_80_columns_the_event_list_drops_whole_columns(sqlite_seeded, orders_registry):
    """Issue 43: at 80 columns the list cut its headers ("te" for tenant). Every header
    shown is whole, and the columns shown are the first ones, in order."""
    from textual.widgets.data_table import ColumnKey

    from outbox_tui.widgets.event_table import DEAD_LETTER_COLUMNS, EVENT_COLUMNS

    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=(80, 24)) as pilot:
        await started(pilot)
        table = app.main.query_one(EventTable)
        for view, columns in (("e", EVENT_COLUMNS), ("d", DEAD_LETTER_COLUMNS)):
            await pilot.press(view)
            await until(pilot, lambda: table.row_count > 0, "rows")
            await pilot.pause()
            shown = [c.key.value for c in table.ordered_columns]
            assert shown == [key for key, _label in columns][: len(shown)]
            assert len(shown) < len(columns)  # something had to go at 80 columns
            used = sum(c.get_render_width(table) for c in table.ordered_columns)
            assert used <= table.size.width - 2, (shown, used, table.size.width)
            header = table._render_line(0, 0, table.size.width, table.rich_style).text
            for key, label in columns:
                if key in shown:
                    assert label in header, (label, header)
            assert table.columns[ColumnKey(shown[-1])].label.plain in header
        # Wider, the columns come back.
        await pilot.resize_terminal(160, 45)
        await until(pilot, lambda: len(table.ordered_columns) == len(DEAD_LETTER_COLUMNS), "all")
