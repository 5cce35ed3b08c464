"""``/``: filter by status, event type, tenant and aggregate id; typos are explained."""

from __future__ import annotations

import pytest
from textual.widgets import Input, Static

from engine.operating.insights import EventFilter
from outbox_tui.screens.filter import FilterModal, parse_statuses
from outbox_tui.widgets.event_table import EventTable

from .conftest import SIZE, console, paste, started, until


def test_status_words_are_forgiving_but_typos_are_named():
    assert parse_statuses("pending, dead letter") == ("pending", "dead_letter")
    assert parse_statuses("FAILED dead-letter dlq") == ("failed", "dead_letter")
    assert parse_statuses("  ") == ()
    with pytest.raises(ValueError, match="unknown status 'done'"):
        parse_statuses("pending done")


async def test_filter_by_status_type_tenant_and_aggregate(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        table = app.main.query_one(EventTable)
        await pilot.press("slash")
        assert isinstance(app.screen, FilterModal)
        await pilot.press(*"pending")  # typed key by key, with the completion of "pending"
        await paste(pilot, ",failed")
        await pilot.press("tab")
        await paste(pilot, "orders.placed")
        await pilot.press("tab")
        await paste(pilot, "globex")
        await pilot.press("enter")
        wanted = EventFilter(("pending", "failed"), "orders.placed", "globex")
        await until(pilot, lambda: app.main.view.filter == wanted, "the filter")
        await until(pilot, lambda: app.main.browser.pages >= 1, "the filtered page")
        rows = table.events
        assert rows and all(
            e.status in ("pending", "failed")
            and e.event_type == "orders.placed"
            and e.tenant_id == "globex"
            for e in rows
        )
        assert "status=pending,failed" in app.main.query_one("#list").border_title

        aggregate = rows[0].aggregate_id
        await pilot.press("slash", "ctrl+l")  # clear every field first
        await pilot.press("tab", "tab", "tab")
        await paste(pilot, aggregate)
        await pilot.press("enter")
        await until(pilot, lambda: app.main.view.filter == EventFilter(aggregate_id=aggregate), "")
        await until(pilot, lambda: {e.aggregate_id for e in table.events} == {aggregate}, "rows")


async def test_a_typo_keeps_the_dialog_open_and_escape_changes_nothing(
    sqlite_seeded, orders_registry
):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("slash", *"pending done", "enter")
        assert isinstance(app.screen, FilterModal)
        error = app.screen.query_one("#filter-error", Static)
        assert "unknown status 'done'" in str(error.render())
        await pilot.press("escape")
        assert app.screen is app.main and app.main.view.filter == EventFilter()


async def test_dead_letter_view_keeps_its_status_and_its_own_filter(sqlite_seeded, orders_registry):
    app = console(sqlite_seeded, orders_registry)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("d", "slash")
        status = app.screen.query_one("#filter-status", Input)
        assert status.disabled and status.value == "dead_letter"
        await paste(pilot, "orders.placed")
        await pilot.press("enter")
        await until(pilot, lambda: app.main.view.filter.event_type == "orders.placed", "")
        assert app.main.browser.views["events"].filter == EventFilter()
        await pilot.press("e")
        await until(pilot, lambda: app.main.query_one(EventTable).mode == "events", "events")
        assert "all events" in app.main.query_one("#list").border_title
