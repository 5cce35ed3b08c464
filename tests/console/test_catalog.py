"""The console's event catalog (c): the installed apps' types, and one type in full."""

from __future__ import annotations

from textual.widgets import DataTable, Static

from outbox_tui.screens.catalog import CatalogScreen
from outbox_tui.screens.main import MainScreen
from tests.console.conftest import SIZE, console, started


async def test_c_shows_the_catalog_and_the_highlighted_types_schema(sqlite_seeded, orders_registry):
    app = console(
        sqlite_seeded,
        orders_registry,
        installed_apps=("outbox_tui.examples.orders",),
        exchange="shop.events",
    )
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("c")
        assert isinstance(app.screen, CatalogScreen)
        screen = app.screen
        table = screen.query_one("#catalog-types", DataTable)
        types = [str(table.get_row_at(n)[0]) for n in range(table.row_count)]
        assert types == ["orders.cancelled", "orders.placed"]
        title = str(screen.query_one("#catalog-title", Static).render())
        assert "outbox_tui.examples.orders" in title and "exchange shop.events" in title
        detail = lambda: str(screen.query_one("#catalog-detail", Static).render())  # noqa: E731
        assert detail().startswith("orders.cancelled")
        await pilot.press("down")
        await pilot.pause()
        shown = detail()
        assert shown.startswith("orders.placed") and "orders.reserve_stock" in shown
        assert "order_id: string, required" in shown  # the payload's fields
        assert "trace_id: string, optional" in shown
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)


def test_a_property_is_named_in_a_few_words():
    from outbox_tui.screens.catalog import field_type

    assert field_type({"type": "integer"}) == "integer"
    assert field_type({"type": ["null", "string"]}) == "null | string"
    assert field_type({"anyOf": [{"type": "string"}, {"type": "null"}]}) == "string | null"
    assert field_type({"type": "array", "items": {"$ref": "#/$defs/Line"}}) == "array of Line"
