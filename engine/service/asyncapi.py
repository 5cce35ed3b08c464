"""``outbox-tui catalog --asyncapi``: the catalog as an AsyncAPI 3.0 document.

What the relay sends (a ``send`` operation per event type, on its routing key) and what the
inbox receives (a ``receive`` operation per binding), with one CloudEvents message per
registered version that both share. Kept apart from ``engine.service.catalog``, which
builds the ``Catalog`` it reads, so that each stays one concern.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from engine.service.catalog import Catalog

ASYNCAPI_VERSION = "3.0.0"
CLOUDEVENTS_CONTENT_TYPE = "application/cloudevents+json"
ANY_CLOUDEVENT = "CloudEvent"  # the message of an inbox binding no registered type matches
_ID = re.compile(r"[^\w.\-]")


def asyncapi_document(
    catalog: Catalog, *, title: str, version: str, amqp_url: str | None = None
) -> dict[str, Any]:
    """An AsyncAPI 3.0 document of what the relay sends: one channel per event type (its
    routing key on the topic exchange), one message per version (a CloudEvents JSON body
    whose ``data`` is the payload), one ``send`` operation per type. Handlers and
    ordering ride along as ``x-outbox-*`` extensions. What the inbox receives: one
    channel per binding and a ``receive`` operation on it (``_receive``). ``amqp_url``
    (its host only, never its credentials) names the server."""
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
            "bindings": _exchange_binding(catalog.exchange),
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
    _receive(catalog, channels, operations, messages)
    description = (
        "Events written by the transactional outbox (outbox-tui) and relayed to the "
        f"RabbitMQ topic exchange {catalog.exchange!r}."
    )
    if catalog.inbox.queue:
        description += f" The inbox takes events off the queue {catalog.inbox.queue!r}."
    document: dict[str, Any] = {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {"title": title, "version": version, "description": description},
        "defaultContentType": CLOUDEVENTS_CONTENT_TYPE,
        "channels": channels,
        "operations": operations,
        "components": {"schemas": schemas, "messages": messages},
    }
    if amqp_url:
        document["servers"] = {"rabbitmq": _server(amqp_url)}
    return document


def _receive(
    catalog: Catalog,
    channels: dict[str, Any],
    operations: dict[str, Any],
    messages: dict[str, Any],
) -> None:
    """A channel per inbox binding (its address the routing key, on the bound exchange)
    and a ``receive`` operation on it. Its messages are those of the registered types the
    routing key matches; a binding that matches none carries ``CloudEvent`` (any
    CloudEvents 1.0 body: the inbox stores it, and it waits until a handler serves it)."""
    inbox = catalog.inbox
    versions = {entry.event_type: entry.versions for entry in catalog.entries}
    for binding in inbox.bindings:
        base = _identifier(f"{binding.exchange}.{binding.routing_key}")
        channel_id = _unique(f"inbox.{base}", channels)
        channel_messages = {
            message_id: {"$ref": f"#/components/messages/{message_id}"}
            for event_type in binding.event_types
            for message_id in (
                _identifier(f"{event_type}.v{v.version}") for v in versions[event_type]
            )
        }
        if not channel_messages:
            messages.setdefault(ANY_CLOUDEVENT, _any_cloudevent_message())
            channel_messages[ANY_CLOUDEVENT] = {"$ref": f"#/components/messages/{ANY_CLOUDEVENT}"}
        queue = {"x-outbox-queue": inbox.queue} if inbox.queue else {}
        where = f"the queue {inbox.queue!r}" if inbox.queue else "its queue"
        channels[channel_id] = {
            "address": binding.routing_key,
            "title": f"inbox {binding.name}",
            "messages": channel_messages,
            "bindings": _exchange_binding(binding.exchange),
        }
        operations[_unique(f"receive.{base}", operations)] = {
            "action": "receive",
            "title": f"inbox {binding.name}",
            "summary": f"The inbox takes what {binding.name} routes to {where} into the "
            "outbox, once per CloudEvents (source, id); the dispatchers deliver it to the "
            "handlers.",
            "channel": {"$ref": f"#/channels/{channel_id}"},
            "messages": [
                {"$ref": f"#/channels/{channel_id}/messages/{message_id}"}
                for message_id in channel_messages
            ],
            "bindings": {"amqp": {"ack": True, "bindingVersion": "0.3.0"}},
            **queue,
        }


def _unique(key: str, taken: Mapping[str, Any]) -> str:
    """``key``, or ``key-2``, ``key-3``...: ``orders.#`` and ``orders.*`` both read
    ``orders._`` as identifiers."""
    found, n = key, 1
    while found in taken:
        n += 1
        found = f"{key}-{n}"
    return found


def _exchange_binding(exchange: str) -> dict[str, Any]:
    """A channel's AMQP binding: a routing key on ``exchange``, a durable topic exchange
    (as the relay and the inbox declare it)."""
    return {
        "amqp": {
            "is": "routingKey",
            "exchange": {
                "name": exchange,
                "type": "topic",
                "durable": True,
                "autoDelete": False,
                "vhost": "/",
            },
            "bindingVersion": "0.3.0",
        }
    }


def _any_cloudevent_message() -> dict[str, Any]:
    """Any CloudEvents 1.0 structured body: what the inbox reads of an unregistered type."""
    text = {"type": "string"}
    return {
        "name": ANY_CLOUDEVENT,
        "title": "any CloudEvent",
        "contentType": CLOUDEVENTS_CONTENT_TYPE,
        "payload": {
            "type": "object",
            "required": ["specversion", "id", "source", "type"],
            "properties": {
                "specversion": {"const": "1.0"},
                "id": text,
                "source": text,
                "type": text,
                "data": {"type": "object"},
            },
        },
    }


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
