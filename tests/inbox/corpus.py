"""Messages the inbox must read, and malformed ones it must store dead-lettered.

Each ``Case`` is a message as a producer sends it (body, content type, headers) and what
it must become: a deliverable event, an event of a type the receiving service does not
register (``unknown_type``: stored pending, it waits as an unserved type), or a dead
letter whose reason holds ``reason``. The decoding tests read them in-process; the
consumer tests send them through the real broker with good messages around them.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

STRUCTURED = "application/cloudevents+json"
SOURCE = "/shop/order"
TYPE = "orders.placed"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
LIMIT = 4096  # the max_message_bytes the corpus is read with


def event(event_id: str, **extra: Any) -> dict[str, Any]:
    """A structured CloudEvent as engine.relay sends one."""
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": SOURCE,
        "type": TYPE,
        "subject": f"order/{event_id}",
        "time": "2026-01-01T12:00:00Z",
        "datacontenttype": "application/json",
        "tenantid": "acme",
        "eventversion": 1,
        "aggregatetype": "order",
        "aggregateid": event_id,
        "data": {
            "order_id": event_id,
            "amount": 42,
            "tenant_id": "acme",
            "actor_id": "u-1",
            "request_id": "r-1",
        },
        **extra,
    }


def without(body: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in names}


def encoded(body: Any) -> bytes:
    return json.dumps(body).encode()


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes
    content_type: str | None = STRUCTURED
    headers: dict[str, Any] = field(default_factory=dict)
    outcome: str = "dead_letter"  # "event", "unknown_type" or "dead_letter"
    reason: str = ""  # a fragment of the dead letter's reason
    # The identity a dead letter keeps (a second copy is then dropped), if it was read.
    identified: bool = False
    # Where it is refused: "decoding" (engine.inbox.decoding), or "rows" for an event
    # that decodes but does not fit its row (engine.inbox.rows).
    stage: str = "decoding"


def binary_headers(event_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "ce-specversion": "1.0",
        "ce-id": event_id,
        "ce-source": SOURCE,
        "ce-type": TYPE,
        "ce-tenantid": "acme",
        **extra,
    }


GOOD = Case("good", encoded(event("good-1")), outcome="event")

MALFORMED = [
    Case(
        "not a CloudEvent (plain JSON, no content type)",
        encoded({"order_id": "o-1"}),
        content_type=None,
        reason="not a CloudEvent",
    ),
    Case(
        "not a CloudEvent (text)",
        b"hello, world",
        content_type="text/plain",
        reason="not a CloudEvent",
    ),
    Case("not JSON", b'{"specversion": "1.0", "id": ', reason="not JSON"),
    Case("not UTF-8", b"\xff\xfe\x00{garbage", reason="not UTF-8"),
    Case("NaN is no JSON", b'{"specversion": "1.0", "id": NaN}', reason="not JSON"),
    Case(
        "nested too deeply",
        b'{"specversion": "1.0", "data": ' + b"[" * 1000 + b"]" * 1000 + b"}",
        reason="not JSON",
    ),
    Case("JSON but an array", b"[1, 2, 3]", reason="not a JSON object"),
    Case(
        "missing id",
        encoded(without(event("x"), "id")),
        reason="missing required attribute id",
    ),
    Case(
        "missing source",
        encoded(without(event("no-source"), "source")),
        reason="missing required attribute source",
    ),
    Case(
        "missing type",
        encoded(without(event("no-type"), "type")),
        reason="missing required attribute type",
        identified=True,
    ),
    Case(
        "missing specversion",
        encoded(without(event("no-version"), "specversion")),
        reason="missing required attribute specversion",
        identified=True,
    ),
    Case(
        "empty id",
        encoded(event("")),
        reason="attribute id must be a non-empty string",
    ),
    Case(
        "id not a string",
        encoded({**event("x"), "id": 7}),
        reason="attribute id must be a non-empty string",
    ),
    Case(
        "specversion 0.3",
        encoded({**event("v03"), "specversion": "0.3"}),
        reason="unsupported specversion",
        identified=True,
    ),
    Case(
        "over the size limit",
        encoded(event("big", data={"blob": "x" * LIMIT})),
        reason="too large",
    ),
    Case(
        "data is an array",
        encoded({**event("array-data"), "data": [1, 2]}),
        reason="data is JSON array, not a JSON object",
        identified=True,
    ),
    Case(
        "data_base64 is not base64",
        encoded({**without(event("b64"), "data"), "data_base64": "***"}),
        reason="data_base64 is not base64",
        identified=True,
    ),
    Case(
        "data holds a NUL character",
        encoded(event("nul", data={"note": "a\x00b"})),
        reason="NUL character",
        identified=True,
        stage="rows",
    ),
    Case(
        "data holds a lone surrogate",
        b'{"specversion": "1.0", "id": "surrogate", "source": "/shop/order", '
        b'"type": "orders.placed", "data": {"note": "\\ud800"}}',
        reason="lone surrogate",
        identified=True,
        stage="rows",
    ),
    Case(
        "batched CloudEvents",
        encoded([event("batch-1")]),
        content_type="application/cloudevents-batch+json",
        reason="batched CloudEvents",
    ),
    Case(
        "partitionkey too long",
        encoded(event("long-key", partitionkey="k" * 401)),
        reason="partitionkey is longer than 400",
        identified=True,
        stage="rows",
    ),
    Case(
        "eventversion not a number",
        encoded(event("bad-version", eventversion="two")),
        reason="eventversion must be an integer",
        identified=True,
        stage="rows",
    ),
    Case(
        "binary mode, data not JSON",
        b"\x00\x01\x02",
        content_type="application/octet-stream",
        headers=binary_headers("octets"),
        reason="not a JSON object",
        identified=True,
    ),
    Case(
        "binary mode, a header that is not UTF-8",
        encoded({"order_id": "o-1"}),
        content_type="application/json",
        headers={**binary_headers("bad-header"), "ce-subject": bytearray(b"\xff\xfe")},
        reason="is not UTF-8 text",
    ),
    Case(
        "binary mode, missing id",
        encoded({"order_id": "o-1"}),
        content_type="application/json",
        headers=without(binary_headers("x"), "ce-id"),
        reason="missing required attribute id",
    ),
    Case(
        "unknown type",
        encoded({**event("unknown-1"), "type": "billing.unheard_of"}),
        outcome="unknown_type",
    ),
]


def structured_with_base64_data(event_id: str) -> bytes:
    body = without(event(event_id), "data")
    data = {"order_id": event_id, "amount": 1, "tenant_id": "acme"}
    body["data_base64"] = base64.b64encode(json.dumps(data).encode()).decode()
    return encoded(body)
