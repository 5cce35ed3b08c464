"""The console and the inbox: consumers beside the dispatchers, the inbound filter, and an
inbound event's origin in the detail."""

from __future__ import annotations

import io

from rich.console import Console
from textual.widgets import DataTable, Static

from engine.operating.insights import EventFilter
from outbox_tui.screens.filter import FilterModal
from outbox_tui.widgets.consumers import ConsumersPanel
from outbox_tui.widgets.dispatchers import DispatchersPanel
from outbox_tui.widgets.event_detail import EventDetailPane, render_detail
from outbox_tui.widgets.event_table import EventTable
from tests.console.showcase import FixedClock, seed_inbox

from .conftest import SIZE, console, paste, refreshed, started, until


async def inbox_seeded(url: str) -> None:
    """The showcase's inbound events and consumer heartbeats, in this test's database."""
    await seed_inbox(FixedClock(), url)


async def test_consumers_show_beside_the_dispatchers_only_when_there_are_some(
    sqlite_seeded, orders_registry
):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        panel = app.main.query_one(ConsumersPanel)
        assert not panel.display or panel.has_class("-empty")
        await inbox_seeded(sqlite_seeded)
        await refreshed(pilot)
        assert not panel.has_class("-empty")
        table = panel.query_one(DataTable)
        assert table.row_count == 2
        assert "dedup window 7d" in str(panel.border_title)
        dispatchers = app.main.query_one(DispatchersPanel).query_one(DataTable)
        keys = {str(row.value) for row in dispatchers.rows}
        assert not {"orders-inbox-1", "orders-inbox-2"} & keys  # they have a panel of their own


async def test_the_origin_filter_narrows_to_inbound_or_local_events(sqlite_seeded, orders_registry):
    await inbox_seeded(sqlite_seeded)
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        table = app.main.query_one(EventTable)
        everything = len(table.events)
        await pilot.press("slash", *["tab"] * 5)
        await paste(pilot, "Inbound")
        await pilot.press("enter")
        await until(pilot, lambda: app.main.view.filter == EventFilter(origin="inbound"), "")
        await until(pilot, lambda: len(table.events) == 6, "the six inbound events")
        assert "origin=inbound" in str(app.main.query_one("#list").border_title)
        await pilot.press("slash", "ctrl+l", *["tab"] * 5)
        await paste(pilot, "local")
        await pilot.press("enter")
        await until(pilot, lambda: app.main.view.filter == EventFilter(origin="local"), "local")
        await until(pilot, lambda: app.main.browser.pages >= 2, "the local page")
        assert len(table.events) == min(everything, len(table.events))
        assert not any(e.event_type == "inbox.undecodable" for e in table.events)


async def test_an_unknown_origin_keeps_the_dialog_open(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("slash", *["tab"] * 5)
        await paste(pilot, "elsewhere")
        await pilot.press("enter")
        assert isinstance(app.screen, FilterModal)
        error = app.screen.query_one("#filter-error", Static)
        assert "unknown origin 'elsewhere'" in str(error.render())


async def test_an_inbound_events_detail_shows_its_origin_and_a_local_ones_does_not(
    sqlite_seeded, orders_registry
):
    await inbox_seeded(sqlite_seeded)
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        inbound = set(await app.insights.matching_ids(EventFilter(origin="inbound")))
        table = app.main.query_one(EventTable)
        pane = app.main.query_one(EventDetailPane)
        bad = next(i for i, e in enumerate(table.events) if e.event_type == "inbox.undecodable")
        await pilot.press(*["down"] * bad, "enter")
        await until(pilot, lambda: pane.event_id == table.events[bad].id, "the inbound detail")
        shown = detail_text(app, pane)
        assert "Origin (inbound)" in shown
        assert "orders.from-storefront" in shown and "raw body" in shown
        assert "<order id='sf-1045'/>" in shown
        local = next(i for i, e in enumerate(table.events) if e.id not in inbound)
        await pilot.press("escape")
        step = "down" if local > bad else "up"
        await pilot.press(*[step] * abs(local - bad), "enter")
        await until(pilot, lambda: pane.event_id == table.events[local].id, "the local detail")
        assert "Origin (inbound)" not in detail_text(app, pane)


def detail_text(app, pane: EventDetailPane) -> str:  # type: ignore[no-untyped-def]
    assert pane.detail is not None
    out = Console(width=120, record=True, file=io.StringIO())
    out.print(render_detail(pane.detail, app.clock()))
    return out.export_text()
