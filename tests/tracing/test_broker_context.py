"""The context a message carries (relay) and what an inbox takes from it, without a broker."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from engine import EventRegistry
from engine.inbox import ReceivedMessage, RowBuilder, decode_message
from engine.inbox.rows import COLUMNS
from engine.relay.messages import MessageBuilder
from engine.tracing import TraceContext
from engine.writing.envelope import EventEnvelope
from tests.inbox.corpus import LIMIT, STRUCTURED, TRACEPARENT, TYPE, encoded, event

STORED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
SPAN = "1" * 16


def envelope(**fields) -> EventEnvelope:
    return EventEnvelope(
        "0190a8e0-0000-7000-8000-000000000001", "acme", TYPE, 1, "order", "o-1",
        {"order_id": "o-1", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"},
        datetime(2026, 1, 1, tzinfo=UTC), **fields,
    )  # fmt: skip


def sent(envelope: EventEnvelope) -> tuple[dict, dict]:
    message = MessageBuilder("/outbox", lambda: SPAN).build(envelope)
    return json.loads(message.body), dict(message.headers or {})


def test_without_a_tracer_the_message_carries_the_stored_context_as_is():
    body, headers = sent(envelope(traceparent=STORED, tracestate="vendor=abc"))
    assert (body["traceparent"], body["tracestate"]) == (STORED, "vendor=abc")
    assert headers == {"traceparent": STORED, "tracestate": "vendor=abc"}
    assert body["traceid"] == "4bf92f3577b34da6a3ce929d0e0e4736"  # the payload's, as before


def test_a_traced_relay_sends_its_own_spans_context_in_both_places():
    relay_span = TraceContext("00-0af7651916cd43dd8448eb211c80319c-2222222222222222-01", "r=1")
    message = MessageBuilder("/outbox", lambda: SPAN).build(
        envelope(traceparent=STORED, tracestate="vendor=abc"), relay_span
    )
    body, headers = json.loads(message.body), dict(message.headers or {})
    assert (body["traceparent"], body["tracestate"]) == relay_span  # not the stored one
    assert headers == {"traceparent": relay_span.traceparent, "tracestate": "r=1"}


@pytest.mark.parametrize("stored", [None, "garbage"])
def test_without_a_stored_context_the_payloads_trace_id_gives_one_as_before(stored):
    body, headers = sent(envelope(traceparent=stored))
    derived = f"00-4bf92f3577b34da6a3ce929d0e0e4736-{SPAN}-01"
    assert body["traceparent"] == derived and "tracestate" not in body
    assert headers == {"traceparent": derived}


def rows_of(message: ReceivedMessage) -> dict:
    registry = EventRegistry()
    registry.register_event(TYPE, 1)
    row = RowBuilder(registry, queue="q").row(message, decode_message(message, max_bytes=LIMIT))
    return dict(zip(COLUMNS, row.values, strict=True))


@pytest.mark.parametrize("as_bytes", [False, True])
def test_an_inbox_takes_the_amqp_headers_context_when_the_cloudevent_has_none(as_bytes):
    def text(value: str) -> str | bytes:
        return value.encode() if as_bytes else value

    headers = {"traceparent": text(STORED), "tracestate": text("vendor=abc")}
    values = rows_of(ReceivedMessage(encoded(event("e-1")), STRUCTURED, headers))
    assert (values["traceparent"], values["tracestate"]) == (STORED, "vendor=abc")


def test_the_cloudevents_own_context_wins_over_the_headers():
    headers = {"traceparent": STORED}
    body = encoded(event("e-1", traceparent=TRACEPARENT))
    assert rows_of(ReceivedMessage(body, STRUCTURED, headers))["traceparent"] == TRACEPARENT


@pytest.mark.parametrize("header", ["00-xyz", b"\xff\xfe", 7])
def test_an_invalid_header_context_is_ignored(header):
    values = rows_of(ReceivedMessage(encoded(event("e-1")), STRUCTURED, {"traceparent": header}))
    assert values["traceparent"] is None and values["tracestate"] is None
