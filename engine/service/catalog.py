"""The event catalog: what the installed apps declare, for people and for tools.

Built from a registry alone (no database): each event type with its versions and their
payload schemas as JSON Schema, its handlers, its ordering, and where the RabbitMQ relay
publishes it; and, when the inbox's queue and bindings are given (the settings ``outbox-tui
consume`` reads), which of those types the inbox receives. ``catalog_record`` is the
``outbox-tui catalog --json`` object, ``engine.service.asyncapi``'s
``asyncapi_document`` the ``--asyncapi`` AsyncAPI 3.0 document; the console shows the same
``Catalog``.

A payload's schema always has the context fields every outbox payload carries
(``tenant_id``, ``actor_id``, ``request_id``, optional ``trace_id``); an
``EventSchemaSpec`` becomes a JSON Schema of its field types, a pydantic model gives its
own (``model_json_schema``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.inbox.topics import split_binding, topic_matches
from engine.writing.models import ModelSchema
from engine.writing.registry import EventRegistry
from engine.writing.schema_spec import (
    CONTEXT_FIELDS,
    OPTIONAL_CONTEXT_FIELDS,
    EventSchemaSpec,
    FieldType,
)

_JSON_TYPES = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    dict: "object",
    list: "array",
    type(None): "null",
}


@dataclass(frozen=True, slots=True)
class CatalogVersion:
    """One registered version: its payload's JSON Schema and where that came from."""

    version: int
    schema_kind: str  # "pydantic", "fields" (EventSchemaSpec) or "context" (no schema)
    model: str | None  # the pydantic model's qualified name
    json_schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CatalogHandler:
    key: str
    transactional: bool


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One event type: versions, handlers, ordering and the relay's routing key."""

    event_type: str
    versions: tuple[CatalogVersion, ...]
    handlers: tuple[CatalogHandler, ...]
    ordering_key: str | None  # "aggregate", "payload" (a function of it) or None: unordered
    on_dead_letter: str | None
    routing_key: str


@dataclass(frozen=True, slots=True)
class InboxBinding:
    """One binding of the inbox's queue, and the registered types its routing key matches
    (the relay publishes a type with the type as routing key)."""

    exchange: str
    routing_key: str
    event_types: tuple[str, ...]

    @property
    def name(self) -> str:
        """``EXCHANGE:ROUTING_KEY``, as ``--bind`` takes it."""
        return f"{self.exchange}:{self.routing_key}"


@dataclass(frozen=True, slots=True)
class CatalogInbox:
    """What ``outbox-tui consume`` takes in: its queue (None: not given) and bindings."""

    queue: str | None = None
    bindings: tuple[InboxBinding, ...] = ()

    @property
    def configured(self) -> bool:
        return self.queue is not None or bool(self.bindings)

    @property
    def event_types(self) -> tuple[str, ...]:
        """The registered types some binding routes to the queue, sorted."""
        return tuple(sorted({t for b in self.bindings for t in b.event_types}))

    def bindings_for(self, event_type: str) -> tuple[InboxBinding, ...]:
        return tuple(b for b in self.bindings if event_type in b.event_types)


@dataclass(frozen=True, slots=True)
class Catalog:
    """Every event type the installed apps declare, the relay's exchange and the inbox."""

    apps: tuple[str, ...]
    exchange: str
    relaying: bool
    entries: tuple[CatalogEntry, ...]
    inbox: CatalogInbox = CatalogInbox()


def build_catalog(
    registry: EventRegistry,
    *,
    apps: Iterable[str],
    exchange: str,
    relaying: bool,
    queue: str | None = None,
    bindings: Iterable[str] = (),
) -> Catalog:
    """The catalog of ``registry``'s event types, sorted by type. ``queue`` and
    ``bindings`` (``EXCHANGE:ROUTING_KEY``) are the inbox's, as ``consume`` takes them."""
    entries = []
    for event_type in sorted({t for t, _v in registry.event_types()}):
        ordering = registry.ordering(event_type)
        entries.append(
            CatalogEntry(
                event_type=event_type,
                versions=tuple(
                    _version(registry, event_type, v) for v in registry.versions_of(event_type)
                ),
                handlers=tuple(
                    CatalogHandler(h.key, bool(getattr(h, "transactional", False)))
                    for h in registry.handlers_for(event_type)
                ),
                ordering_key=None
                if ordering is None
                else ("aggregate" if ordering.key == "aggregate" else "payload"),
                on_dead_letter=None if ordering is None else ordering.on_dead_letter,
                routing_key=event_type,
            )
        )
    types = [entry.event_type for entry in entries]
    return Catalog(
        tuple(apps), exchange, relaying, tuple(entries), inbox_of(types, queue, bindings)
    )


def inbox_of(
    event_types: Iterable[str], queue: str | None, bindings: Iterable[str]
) -> CatalogInbox:
    """The inbox's bindings, each with the ``event_types`` its routing key matches."""
    known = sorted(event_types)
    found = []
    for binding in dict.fromkeys(bindings):  # a binding given twice binds once
        exchange, routing_key = split_binding(binding)
        matched = tuple(t for t in known if topic_matches(routing_key, t))
        found.append(InboxBinding(exchange, routing_key, matched))
    return CatalogInbox(queue, tuple(found))


def _version(registry: EventRegistry, event_type: str, version: int) -> CatalogVersion:
    schema = registry.schema_for(event_type, version)
    if isinstance(schema, ModelSchema):
        model = schema.model
        return CatalogVersion(
            version, "pydantic", model.__qualname__, with_context(schema.json_schema())
        )
    if isinstance(schema, EventSchemaSpec):
        return CatalogVersion(version, "fields", None, with_context(spec_json_schema(schema)))
    return CatalogVersion(version, "context", None, with_context({"type": "object"}))


def _json_type(expected: FieldType) -> str | list[str]:
    types = expected if isinstance(expected, tuple) else (expected,)
    names = sorted({_JSON_TYPES.get(t, "object") for t in types})
    return names[0] if len(names) == 1 else names


def spec_json_schema(spec: EventSchemaSpec) -> dict[str, Any]:
    """An ``EventSchemaSpec`` as JSON Schema: its fields' JSON types; optional fields may
    be null; other fields are allowed (the spec does not refuse them)."""
    properties: dict[str, Any] = {
        name: {"type": _json_type(t)} for name, t in spec.required.items()
    }
    for name, expected in spec.optional.items():
        json_type = _json_type(expected)
        listed = json_type if isinstance(json_type, list) else [json_type]
        properties[name] = {"type": sorted({*listed, "null"})}
    return {"type": "object", "required": sorted(spec.required), "properties": properties}


def with_context(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with the context fields every outbox payload carries."""
    result = dict(schema)
    properties = dict(result.get("properties", {}))
    for name in (*CONTEXT_FIELDS, *OPTIONAL_CONTEXT_FIELDS):
        properties.setdefault(name, {"type": "string"})
    result["properties"] = properties
    result["required"] = [*result.get("required", []), *CONTEXT_FIELDS]
    result["required"] = list(dict.fromkeys(result["required"]))
    return result


# -- outbox-tui catalog --json -------------------------------------------------------------


def catalog_record(catalog: Catalog) -> dict[str, Any]:
    """The catalog as one JSON object (``outbox-tui catalog --json``; docs/cli.md)."""
    return {
        "installed_apps": list(catalog.apps),
        "relay": {
            "exchange": catalog.exchange,
            "exchange_type": "topic",
            "configured": catalog.relaying,
        },
        "event_types": [
            {
                "event_type": entry.event_type,
                "versions": [
                    {
                        "version": v.version,
                        "schema_kind": v.schema_kind,
                        "model": v.model,
                        "json_schema": v.json_schema,
                    }
                    for v in entry.versions
                ],
                "handlers": [
                    {"key": h.key, "transactional": h.transactional} for h in entry.handlers
                ],
                "ordering": None
                if entry.ordering_key is None
                else {"key": entry.ordering_key, "on_dead_letter": entry.on_dead_letter},
                "routing_key": entry.routing_key,
            }
            for entry in catalog.entries
        ],
        "inbox": inbox_record(catalog.inbox),
    }


def inbox_record(inbox: CatalogInbox) -> dict[str, Any]:
    """The ``inbox`` key of ``catalog --json``: queue, bindings and the types they route."""
    return {
        "configured": inbox.configured,
        "queue": inbox.queue,
        "bindings": [
            {
                "exchange": b.exchange,
                "routing_key": b.routing_key,
                "event_types": list(b.event_types),
            }
            for b in inbox.bindings
        ],
        "event_types": list(inbox.event_types),
    }
