"""Reading CloudEvents out of AMQP messages: both content modes, and every malformed case."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from engine.inbox import InboundEvent, ReceivedMessage, Undecodable, decode_message
from engine.relay.cloudevents import encode_cloudevent, to_cloudevent
from engine.writing.envelope import EventEnvelope
from tests.inbox.corpus import (
    GOOD,
    LIMIT,
    MALFORMED,
    SOURCE,
    STRUCTURED,
    TRACEPARENT,
    TYPE,
    binary_headers,
    encoded,
    event,
    structured_with_base64_data,
)


def decode(body: bytes, content_type: str | None = STRUCTURED, **headers: object):
    return decode_message(ReceivedMessage(body, content_type, headers), max_bytes=LIMIT)


def test_structured_mode_reads_what_the_relay_sends():
    envelope = EventEnvelope(
        "0190-abc",
        "acme",
        "orders.placed",
        2,
        "order",
        "o-7",
        {"order_id": "o-7", "tenant_id": "acme", "trace_id": TRACEPARENT},
        created_at=datetime(2026, 1, 1, 12, tzinfo=UTC),
    )
    body = encode_cloudevent(to_cloudevent(envelope, source_prefix="/shop"))
    decoded = decode(body)
    assert isinstance(decoded, InboundEvent)
    assert (decoded.id, decoded.source, decoded.type) == ("0190-abc", "/shop/order", TYPE)
    assert decoded.mode == "structured"
    assert decoded.data == dict(envelope.payload)
    assert decoded.attributes["eventversion"] == 2
    assert decoded.attributes["subject"] == "order/o-7"
    assert decoded.attributes["time"] == "2026-01-01T12:00:00Z"
    assert decoded.attributes["traceparent"] == TRACEPARENT
    assert "id" not in decoded.attributes and "data" not in decoded.attributes


def test_binary_mode_reads_ce_headers_and_the_body_as_data():
    data = {"order_id": "o-1", "amount": 3}
    decoded = decode(
        encoded(data),
        "application/json",
        **binary_headers("b-1", **{"ce-subject": "order/o-1", "ce-partitionkey": "order:o-1"}),
    )
    assert isinstance(decoded, InboundEvent)
    assert (decoded.id, decoded.source, decoded.type, decoded.mode) == (
        "b-1",
        SOURCE,
        TYPE,
        "binary",
    )
    assert decoded.data == data
    assert decoded.attributes["datacontenttype"] == "application/json"
    assert decoded.attributes["partitionkey"] == "order:o-1"
    assert decoded.attributes["subject"] == "order/o-1"


@pytest.mark.parametrize("prefix", ["ce-", "ce_", "cloudEvents_", "cloudEvents:", "CE-"])
def test_binary_mode_reads_every_bindings_header_prefix(prefix):
    headers = {prefix + k.removeprefix("ce-"): v for k, v in binary_headers("p-1").items()}
    decoded = decode(b"{}", "application/json", **headers)
    assert isinstance(decoded, InboundEvent) and decoded.id == "p-1"


def test_binary_mode_header_values_may_come_as_bytes_and_without_a_body():
    headers = {k: v.encode() for k, v in binary_headers("bytes-1").items()}
    decoded = decode(b"", None, **headers)
    assert isinstance(decoded, InboundEvent)
    assert decoded.id == "bytes-1" and decoded.data is None


def test_structured_mode_without_its_content_type_is_still_read():
    decoded = decode(encoded(event("plain-1")), "application/json")
    assert isinstance(decoded, InboundEvent) and decoded.id == "plain-1"
    assert isinstance(decode(encoded(event("plain-2")), None), InboundEvent)


def test_data_base64_holding_a_json_object_is_data():
    decoded = decode(structured_with_base64_data("b64-1"))
    assert isinstance(decoded, InboundEvent)
    assert decoded.data == {"order_id": "b64-1", "amount": 1, "tenant_id": "acme"}


def test_a_content_type_with_parameters_and_capitals_is_structured():
    decoded = decode(encoded(event("ct-1")), "Application/CloudEvents+JSON; charset=utf-8")
    assert isinstance(decoded, InboundEvent)


def test_the_good_case_is_an_event():
    assert isinstance(decode(GOOD.body, GOOD.content_type, **GOOD.headers), InboundEvent)


@pytest.mark.parametrize("case", MALFORMED, ids=lambda c: c.name)
def test_every_malformed_message_is_undecodable_with_its_reason(case):
    decoded = decode(case.body, case.content_type, **case.headers)
    if case.outcome != "dead_letter" or case.stage == "rows":
        # An unknown type, or an event unfit for its row: they decode, and the rows set
        # them apart (tests/inbox/test_inbound_rows.py).
        assert isinstance(decoded, InboundEvent), decoded
        return
    assert isinstance(decoded, Undecodable)
    assert case.reason in decoded.reason
    assert "\n" not in decoded.reason
    assert (decoded.id is not None) == case.identified, decoded


def test_a_message_at_the_limit_is_read_and_one_byte_over_is_not():
    body = encoded(event("edge"))
    exact = decode_message(ReceivedMessage(body, STRUCTURED), max_bytes=len(body))
    over = decode_message(ReceivedMessage(body, STRUCTURED), max_bytes=len(body) - 1)
    assert isinstance(exact, InboundEvent)
    assert isinstance(over, Undecodable) and over.reason.startswith("too large")


def test_undecodable_properties_are_kept_json_ready_and_storable():
    message = ReceivedMessage(
        b"x",
        "text/plain",
        {"raw": b"\xff\x00", "text": "a\x00b", "nested": {"n": float("nan")}},
        message_id="m-1",
    )
    kept = message.properties()
    text = json.dumps(kept, allow_nan=False)
    assert "\\u0000" not in text
    assert kept["headers"]["raw"].startswith("base64:")
    assert kept["message_id"] == "m-1"
