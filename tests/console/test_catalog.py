"""The console's event catalog (c): the installed apps' types, the inbox's queue and
bindings, and one type in full."""

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
        inbox = str(screen.query_one("#catalog-inbox", Static).render())
        assert inbox.startswith("no inbox: --queue and --bind")
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


async def test_the_catalog_names_the_inbox_queue_bindings_and_what_each_type_arrives_by(
    sqlite_seeded, orders_registry
):
    app = console(
        sqlite_seeded,
        orders_registry,
        installed_apps=("outbox_tui.examples.orders",),
        queue="billing.inbox",
        bindings=(
            "storefront.events:orders.placed",
            "storefront.events:orders.#",
            "x:[bold]stock.*",  # shown as given, not as markup
        ),
    )
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await pilot.press("c")
        assert isinstance(app.screen, CatalogScreen)
        screen = app.screen
        inbox = str(screen.query_one("#catalog-inbox", Static).render()).splitlines()
        assert inbox == [
            "inbox: queue billing.inbox",
            "  storefront.events:orders.placed → orders.placed",
            "  storefront.events:orders.# → orders.cancelled, orders.placed",
            "  x:[bold]stock.* → no registered type",
        ]
        detail = lambda: str(screen.query_one("#catalog-detail", Static).render())  # noqa: E731
        assert "inbox: received on billing.inbox by storefront.events:orders.#\n" in detail()
        await pilot.press("down")
        await pilot.pause()
        assert (
            "inbox: received on billing.inbox by storefront.events:orders.placed, "
            "storefront.events:orders.#"
        ) in detail()


def test_a_property_is_named_in_a_few_words():
    from outbox_tui.screens.catalog import field_type

    assert field_type({"type": "integer"}) == "integer"
    assert field_type({"type": ["null", "string"]}) == "null | string"
    assert field_type({"anyOf": [{"type": "string"}, {"type": "null"}]}) == "string | null"
    assert field_type({"type": "array", "items": {"$ref": "#/$defs/Line"}}) == "array of Line"


def test_the_console_takes_the_inbox_from_the_settings_consume_reads(sqlite_seeded, monkeypatch):
    from engine.settings import load_settings
    from outbox_tui.console import prepare_console

    monkeypatch.setenv("OUTBOX_CONSUMER__QUEUE", "billing.inbox")
    monkeypatch.setenv("OUTBOX_CONSUMER__BINDINGS", "storefront.events:orders.# x:stock.*")
    settings = load_settings(database_url=sqlite_seeded)
    app = prepare_console(settings, installed_apps=["outbox_tui.examples.orders"])
    assert app.config.queue == "billing.inbox"
    assert app.config.bindings == ("storefront.events:orders.#", "x:stock.*")
