"""The event catalog (``c``): what the installed apps declare, as ``outbox-tui catalog``.

One row per event type (versions and what their schemas are, handlers, ordering, the
relay's routing key), the inbox's queue and bindings above it (from the settings
``consume`` reads); the highlighted type's versions and payload JSON Schemas in full
underneath. Built from the console's registry (``engine.service.catalog``): no database
call, so nothing waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from engine.service.catalog import Catalog, CatalogEntry, CatalogInbox, build_catalog
from engine.settings import DEFAULT_EXCHANGE
from outbox_tui.screens.base import ConsoleScreen
from outbox_tui.widgets.footer import ConsoleFooter
from outbox_tui.widgets.format import (
    MUTED_STYLE,
    catalog_handlers,
    catalog_inbox,
    catalog_ordering,
    catalog_versions,
)
from outbox_tui.widgets.literal_table import LiteralTable

if TYPE_CHECKING:
    from outbox_tui.app import OutboxConsole

NO_INBOX = CatalogInbox()


def entry_detail(entry: CatalogEntry, inbox: CatalogInbox = NO_INBOX) -> Text:
    """``entry`` in full: routing, handlers, the inbox bindings that receive it, and each
    version's payload fields, one line each (``outbox-tui catalog --json`` has the whole
    JSON Schema)."""
    text = Text()
    text.append(f"{entry.event_type} ·", style="bold")
    text.append(f" routing key {entry.routing_key} · {catalog_ordering(entry)}\n")
    text.append(f"handlers: {catalog_handlers(entry)}\n")
    received = inbox.bindings_for(entry.event_type)
    if received:
        queue = f" on {inbox.queue}" if inbox.queue else ""
        text.append(f"inbox: received{queue} by {', '.join(b.name for b in received)}\n")
    for version in entry.versions:
        source = version.model or version.schema_kind
        text.append(f"\nv{version.version} ({source})\n", style="bold")
        required = set(version.json_schema.get("required", []))
        for name, field in version.json_schema.get("properties", {}).items():
            need = "required" if name in required else "optional"
            text.append(f"{name}: {field_type(field)}, {need}\n")
    return text


def field_type(schema: Mapping[str, Any]) -> str:
    """A property's JSON Schema in a few words: ``integer``, ``string | null``, ``Line``,
    ``array of Line``."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " | ".join(field_type(option) for option in schema["anyOf"])
    kind = schema.get("type", "any")
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        return f"array of {field_type(schema['items'])}"
    return " | ".join(kind) if isinstance(kind, list) else str(kind)


class CatalogScreen(ConsoleScreen):
    """The installed apps' event types, one row each, with the highlighted one in full."""

    BINDINGS = [  # noqa: RUF012 - Textual's declaration style
        Binding("escape", "close", "Back"),
    ]

    def __init__(self, console: OutboxConsole) -> None:
        super().__init__(console, id="catalog")
        config = console.config
        self.catalog: Catalog = build_catalog(
            console.registry,
            apps=config.installed_apps,
            exchange=config.exchange or DEFAULT_EXCHANGE,
            relaying=config.amqp_url is not None,
            queue=config.queue,
            bindings=config.bindings,
        )

    def compose(self) -> ComposeResult:
        catalog = self.catalog
        relay = "relay configured" if catalog.relaying else "no relay configured"
        source = f" from {', '.join(catalog.apps)}" if catalog.apps else ""
        yield Static(
            f"Event catalog: {len(catalog.entries)} type(s){source} · exchange "
            f"{catalog.exchange} (topic), {relay}",
            id="catalog-title",
        )
        inbox = catalog_inbox(catalog.inbox) or [
            "no inbox: --queue and --bind, as consume takes them"
        ]
        yield Static(Text("\n".join(inbox)), id="catalog-inbox")  # names, not markup
        yield LiteralTable(id="catalog-types", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="catalog-detail-scroll"):
            yield Static("", id="catalog-detail")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("event type", "versions", "handlers", "ordering", "routing key")
        for entry in self.catalog.entries:
            table.add_row(
                entry.event_type,
                catalog_versions(entry),
                catalog_handlers(entry),
                catalog_ordering(entry),
                entry.routing_key,
                key=entry.event_type,
            )
        table.focus()
        self._show_highlighted()

    def action_close(self) -> None:
        self.app.pop_screen()

    @on(DataTable.RowHighlighted, "#catalog-types")
    def _show_highlighted(self) -> None:
        detail = self.query_one("#catalog-detail", Static)
        entry = self.highlighted()
        if entry is None:
            detail.update(
                Text(
                    "No event types: start the console with --installed-app MODULE.",
                    style=MUTED_STYLE,
                )
            )
            return
        detail.update(entry_detail(entry, self.catalog.inbox))

    def highlighted(self) -> CatalogEntry | None:
        entries = self.catalog.entries
        table = self.query_one(DataTable)
        if not entries or table.row_count == 0:
            return None
        return entries[min(table.cursor_row, len(entries) - 1)]
