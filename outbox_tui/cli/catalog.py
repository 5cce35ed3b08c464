"""``outbox-tui catalog``: the event types the installed apps declare, for people and tools."""

from __future__ import annotations

import json
from typing import Any

from engine.errors import InstalledAppError
from engine.service.asyncapi import asyncapi_document
from engine.service.catalog import Catalog, build_catalog, catalog_record
from engine.settings import ConsumerSettings, OutboxSettings
from outbox_tui import PROG, __version__
from outbox_tui.cli.errors import EXIT_OK
from outbox_tui.cli.options import Invocation, add_bindings, add_json, add_settings, subparser
from outbox_tui.output.tables import Table
from outbox_tui.widgets.format import (
    catalog_handlers,
    catalog_inbox,
    catalog_ordering,
    catalog_versions,
)


def register(sub: Any) -> None:
    p = subparser(
        sub,
        "catalog",
        "the event types, versions, schemas, handlers and routing of the installed apps",
        "List what the installed apps declare, without a database: each event type with "
        "its versions and their payload schemas (JSON Schema, from an EventSchemaSpec or a "
        "pydantic model), its handlers, its ordering, and the exchange and routing key the "
        "RabbitMQ relay publishes it with; with the inbox's --queue and --bind (as consume "
        "takes them), which of those types the inbox receives. --asyncapi writes an "
        "AsyncAPI 3.0 document.",
        f"{PROG} catalog --installed-app shop.outbox",
        f"{PROG} catalog --installed-app billing.outbox --queue billing.inbox "
        "--bind outbox.events:orders.#",
        f"{PROG} catalog --installed-app shop.outbox --json",
        f"{PROG} catalog --installed-app shop.outbox --asyncapi > asyncapi.json",
    )
    relay = p.add_argument_group("the relay the document describes")
    add_settings(relay, OutboxSettings, ("amqp_url", "exchange"))
    inbox = p.add_argument_group("the inbox the document describes (as consume takes it)")
    add_settings(inbox, ConsumerSettings, ("queue",))
    add_bindings(inbox)
    mode = p.add_mutually_exclusive_group()
    add_json(mode, "print one JSON object")
    mode.add_argument(
        "--asyncapi",
        action="store_true",
        help="print an AsyncAPI 3.0 document (JSON) of what the relay publishes and the "
        "inbox receives",
    )
    p.set_defaults(run=catalog)


def catalog_of(inv: Invocation) -> Catalog:
    """The installed apps' catalog (one error line when no app is given)."""
    if inv.registry is None:
        raise InstalledAppError(
            "the catalog lists what installed apps declare: give --installed-app MODULE "
            "(or OUTBOX_INSTALLED_APPS)"
        )
    return build_catalog(
        inv.registry,
        apps=inv.installed_apps,
        exchange=inv.settings.exchange,
        relaying=inv.settings.amqp_url is not None,
        queue=inv.settings.consumer.queue,
        bindings=inv.settings.consumer.bindings,
    )


def catalog(inv: Invocation) -> int:
    found = catalog_of(inv)
    if inv.opt("asyncapi"):
        document = asyncapi_document(
            found,
            title=f"{', '.join(found.apps)} events",
            version=__version__,
            amqp_url=inv.settings.amqp_url,
        )
        inv.out.say(json.dumps(document, indent=2))
    elif inv.json:
        inv.out.json(catalog_record(found))
    else:
        inv.out.console.print(catalog_table(found))
    return EXIT_OK


def catalog_table(found: Catalog) -> Table:
    relay = "relay configured" if found.relaying else "no relay configured"
    inbox = catalog_inbox(found.inbox) or ["no inbox: --queue and --bind, as consume takes them"]
    table = Table(
        title=f"{len(found.entries)} event type(s): exchange {found.exchange} (topic), {relay}",
        title_justify="left",
        caption="\n".join(inbox),
        caption_justify="left",
    )
    for name in ("event type", "versions", "handlers", "ordering", "routing key"):
        table.add_column(name)
    for entry in found.entries:
        table.add_row(
            entry.event_type,
            catalog_versions(entry),
            catalog_handlers(entry),
            catalog_ordering(entry),
            entry.routing_key,
        )
    return table
