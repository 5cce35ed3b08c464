"""The event catalog: what the installed apps declare, for people and for tools.

Built from a registry alone (no database): each event type with its versions and their
payload schemas as JSON Schema, its handlers, its ordering, and where the RabbitMQ relay
publishes it. ``catalog_record`` is the ``outbox-tui catalog --json`` object,
``asyncapi_document`` the ``--asyncapi`` AsyncAPI 3.0 document; the console shows the same
``Catalog``.

A payload's schema always has the context fields every outbox payload carries
(``tenant_id``, ``actor_id``, ``request_id``, optional ``trace_id``); an
``EventSchemaSpec`` becomes a JSON Schema of its field types, a pydantic model gives its
own (``model_json_schema``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from engine.writing.models import ModelSchema
from engine.writing.registry import EventRegistry
from engine.writing.schema_spec import (
    CONTEXT_FIELDS,
    OPTIONAL_CONTEXT_FIELDS,
    EventSchemaSpec,
    FieldType,
)

ASYNCAPI_VERSION = "3.0.0"
CLOUDEVENTS_CONTENT_TYPE = "application/cloudevents+json"
_JSON_TYPES = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    dict: "object",
    list: "array",
    type(None): "null",
}
_ID = re.compile(r"[^\w.\-]")


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
class Catalog:
    """Every event type the installed apps declare, and the relay's exchange."""

    apps: tuple[str, ...]
    exchange: str
    relaying: bool
    entries: tuple[CatalogEntry, ...]


def build_catalog(
    registry: EventRegistry, *, apps: Iterable[str], exchange: str, relaying: bool
) -> Catalog:
    """The catalog of ``registry``'s event types, sorted by type."""
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
    return Catalog(tuple(apps), exchange, relaying, tuple(entries))


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
    }


# -- outbox-tui catalog --asyncapi ---------------------------------------------------------


def asyncapi_document(
    catalog: Catalog, *, title: str, version: str, amqp_url: str | None = None
) -> dict[str, Any]:
    """An AsyncAPI 3.0 document of what the relay sends: one channel per event type (its
    routing key on the topic exchange), one message per version (a CloudEvents JSON body
    whose ``data`` is the payload), one ``send`` operation per type. Handlers and
    ordering ride along as ``x-outbox-*`` extensions. ``amqp_url`` (its host only, never
    its credentials) names the server."""
    schemas: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for entry in catalog.entries:
        channel_id = _identifier(entry.event_type)
        channel_messages = {}
        for v in entry.versions:
            message_id = _identifier(f"{entry.event_type}.v{v.version}")
            schemas[message_id] = _hoisted(v.json_schema, schemas)
            messages[message_id] = {
                "name": message_id,
                "title": f"{entry.event_type} v{v.version}",
                "contentType": CLOUDEVENTS_CONTENT_TYPE,
                "payload": _cloudevent_schema(entry.event_type, v.version, message_id),
                "bindings": {"amqp": {"messageType": entry.event_type, "bindingVersion": "0.3.0"}},
            }
            channel_messages[message_id] = {"$ref": f"#/components/messages/{message_id}"}
        channels[channel_id] = {
            "address": entry.routing_key,
            "title": entry.event_type,
            "messages": channel_messages,
            "bindings": {
                "amqp": {
                    "is": "routingKey",
                    "exchange": {
                        "name": catalog.exchange,
                        "type": "topic",
                        "durable": True,
                        "autoDelete": False,
                        "vhost": "/",
                    },
                    "bindingVersion": "0.3.0",
                }
            },
            "x-outbox-handlers": [
                {"key": h.key, "transactional": h.transactional} for h in entry.handlers
            ],
            "x-outbox-ordering": None
            if entry.ordering_key is None
            else {"key": entry.ordering_key, "onDeadLetter": entry.on_dead_letter},
        }
        operations[_identifier(f"send.{entry.event_type}")] = {
            "action": "send",
            "title": f"relay {entry.event_type}",
            "summary": f"The outbox relay publishes {entry.event_type} once its row commits.",
            "channel": {"$ref": f"#/channels/{channel_id}"},
            "messages": [
                {"$ref": f"#/channels/{channel_id}/messages/{message_id}"}
                for message_id in channel_messages
            ],
        }
    document: dict[str, Any] = {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": title,
            "version": version,
            "description": "Events written by the transactional outbox (outbox-tui) and "
            f"relayed to the RabbitMQ topic exchange {catalog.exchange!r}.",
        },
        "defaultContentType": CLOUDEVENTS_CONTENT_TYPE,
        "channels": channels,
        "operations": operations,
        "components": {"schemas": schemas, "messages": messages},
    }
    if amqp_url:
        document["servers"] = {"rabbitmq": _server(amqp_url)}
    return document


def _identifier(text: str) -> str:
    """A component or channel key AsyncAPI accepts (letters, digits, ``.``, ``-``, ``_``)."""
    return _ID.sub("_", text)


def _hoisted(schema: Mapping[str, Any], into: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without its ``$defs``, which go to ``components/schemas`` under their
    names, with every ``#/$defs/X`` reference pointing there."""
    result = dict(schema)
    for name, definition in dict(result.pop("$defs", {})).items():
        into.setdefault(_identifier(name), _rewritten(definition))
    rewritten: dict[str, Any] = _rewritten(result)
    return rewritten


def _rewritten(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _rewritten(v) for k, v in value.items()}
        ref = out.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            out["$ref"] = "#/components/schemas/" + _identifier(ref.removeprefix("#/$defs/"))
        return out
    if isinstance(value, list):
        return [_rewritten(v) for v in value]
    return value


def _cloudevent_schema(event_type: str, version: int, payload_id: str) -> dict[str, Any]:
    """The relay's CloudEvents 1.0 structured body (docs/relay.md), ``data`` = the payload."""
    text = {"type": "string"}
    return {
        "type": "object",
        "required": [
            "specversion",
            "id",
            "source",
            "type",
            "subject",
            "time",
            "datacontenttype",
            "data",
            "tenantid",
            "eventversion",
            "aggregatetype",
            "aggregateid",
        ],
        "properties": {
            "specversion": {"const": "1.0"},
            "id": text,
            "source": text,
            "type": {"const": event_type},
            "subject": text,
            "time": {"type": "string", "format": "date-time"},
            "datacontenttype": {"const": "application/json"},
            "data": {"$ref": f"#/components/schemas/{payload_id}"},
            "tenantid": text,
            "eventversion": {"const": version},
            "aggregatetype": text,
            "aggregateid": text,
            "traceid": text,
            "traceparent": text,
        },
    }


def _server(amqp_url: str) -> dict[str, Any]:
    url = urlsplit(amqp_url)
    host = url.hostname or "localhost"
    if url.port:
        host = f"{host}:{url.port}"
    secure = url.scheme == "amqps"
    return {"host": host, "protocol": "amqps" if secure else "amqp", "protocolVersion": "0.9.1"}
