"""What an arriving message becomes: the values of its outbox row."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine import EventRegistry
from engine.inbox import UNDECODABLE_TYPE, ReceivedMessage, RowBuilder, decode_message
from engine.inbox.rows import COLUMNS, InboundRow, valid_traceparent
from tests.inbox.corpus import (
    LIMIT,
    MALFORMED,
    SOURCE,
    STRUCTURED,
    TRACEPARENT,
    TYPE,
    binary_headers,
    encoded,
    event,
    without,
)


@pytest.fixture
def registry() -> EventRegistry:
    reg = EventRegistry()
    reg.register_event(TYPE, 1)
    reg.register_event("invoices.sent", 1)
    reg.set_ordering("invoices.sent", key=lambda payload: f"customer:{payload['customer']}")
    return reg


def row_of(
    builder: RowBuilder, body: bytes, content_type: str | None = STRUCTURED, **headers: Any
) -> tuple[InboundRow, dict[str, Any]]:
    message = ReceivedMessage(body, content_type, headers, message_id="amqp-1")
    row = builder.row(message, decode_message(message, max_bytes=LIMIT))
    return row, dict(zip(COLUMNS, row.values, strict=True))


def test_an_event_gets_a_local_id_and_keeps_its_identity_origin_and_attributes(registry):
    builder = RowBuilder(registry, queue="shop.inbox")
    body = event("0190-aaaa", partitionkey="order:o-1", traceparent=TRACEPARENT, tracestate="k=v")
    row, values = row_of(builder, encoded(body))
    assert row.kind == "event"
    assert values["id"] != "0190-aaaa" and len(values["id"]) == 36  # a new local UUIDv7
    assert (values["inbound_source"], values["inbound_id"]) == (SOURCE, "0190-aaaa")
    assert row.identity == (SOURCE, "0190-aaaa")
    assert values["inbound_queue"] == "shop.inbox"
    assert (values["event_type"], values["event_version"], values["tenant_id"]) == (TYPE, 1, "acme")
    assert (values["aggregate_type"], values["aggregate_id"]) == ("order", "0190-aaaa")
    assert values["ordering_key"] == "order:o-1"
    assert (values["traceparent"], values["tracestate"]) == (TRACEPARENT, "k=v")
    assert values["status"] == "pending" and values["inbound_body"] is None
    assert json.loads(values["payload"]) == body["data"]
    attributes = json.loads(values["inbound_attributes"])
    assert attributes["subject"] == "order/0190-aaaa"
    assert attributes["time"] == "2026-01-01T12:00:00Z"
    assert attributes["partitionkey"] == "order:o-1"
    assert not {"id", "source", "type", "data", "traceparent", "tracestate"} & set(attributes)


def test_two_deliveries_of_one_event_get_two_local_ids_and_one_identity(registry):
    builder = RowBuilder(registry, queue="q")
    first, _ = row_of(builder, encoded(event("e-1")))
    second, _ = row_of(builder, encoded(event("e-1")))
    assert first.event_id != second.event_id
    assert first.identity == second.identity


def test_a_foreign_event_gets_the_context_fields_a_handler_expects(registry):
    builder = RowBuilder(registry, queue="q", default_tenant="tenant-0")
    _, values = row_of(
        builder,
        encoded({"n": 1}),
        "application/json",
        **without(binary_headers("f-1", **{"ce-subject": "thing/9"}), "ce-tenantid"),
    )
    payload = json.loads(values["payload"])
    assert payload == {"n": 1, "tenant_id": "tenant-0", "actor_id": SOURCE, "request_id": "f-1"}
    assert values["tenant_id"] == "tenant-0"
    assert (values["aggregate_type"], values["aggregate_id"]) == ("inbound", "thing/9")
    registry.validate_event(TYPE, 1, payload, values["tenant_id"])  # a handler may run


def test_without_a_partitionkey_the_registrys_ordering_applies(registry):
    builder = RowBuilder(registry, queue="q")
    body = {
        **event("i-1"),
        "type": "invoices.sent",
        "data": {"customer": "c-9", "tenant_id": "acme"},
    }
    _, values = row_of(builder, encoded(body))
    assert values["ordering_key"] == "customer:c-9"
    _, unordered = row_of(builder, encoded(event("o-2")))
    assert unordered["ordering_key"] is None


def test_an_invalid_traceparent_stays_an_attribute_and_the_row_has_none(registry):
    builder = RowBuilder(registry, queue="q")
    _, values = row_of(builder, encoded(event("t-1", traceparent="00-xyz", tracestate="a=b")))
    assert values["traceparent"] is None and values["tracestate"] is None
    assert json.loads(values["inbound_attributes"])["traceparent"] == "00-xyz"


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (TRACEPARENT, True),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),
        ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", False),
        (TRACEPARENT + "-extra", False),  # version 00 has exactly four fields
        ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", True),
    ],
)
def test_traceparents_are_checked_as_w3c_says(value, valid):
    assert valid_traceparent(value) is valid


def test_an_unknown_type_is_stored_pending_and_set_apart(registry):
    builder = RowBuilder(registry, queue="q")
    row, values = row_of(builder, encoded({**event("u-1"), "type": "billing.unheard_of"}))
    assert row.kind == "unknown_type"
    assert values["status"] == "pending" and values["event_type"] == "billing.unheard_of"


def test_an_undecodable_message_is_a_dead_letter_keeping_its_raw_body(registry):
    builder = RowBuilder(registry, queue="q", default_tenant="t0")
    raw = b"\xff\xfe\x00{garbage"
    row, values = row_of(builder, raw, STRUCTURED, **{"x-origin": "legacy"})
    assert row.kind == "dead_letter" and row.identity is None
    assert values["status"] == "dead_letter"
    assert values["event_type"] == UNDECODABLE_TYPE and values["tenant_id"] == "t0"
    assert values["inbound_body"] == raw  # bytes as received
    assert values["dead_letter_reason"].startswith("permanent: inbox: not JSON")
    assert values["last_error"].startswith("inbox: not JSON")
    assert values["ordering_key"] is None
    amqp = json.loads(values["payload"])["amqp"]
    assert amqp["message_id"] == "amqp-1" and amqp["headers"] == {"x-origin": "legacy"}


@pytest.mark.parametrize("case", MALFORMED, ids=lambda c: c.name)
def test_every_malformed_message_becomes_the_row_it_must(registry, case):
    builder = RowBuilder(registry, queue="q")
    row, values = row_of(builder, case.body, case.content_type, **case.headers)
    assert row.kind == case.outcome
    if case.outcome != "dead_letter":
        return
    assert case.reason in values["dead_letter_reason"]
    assert values["inbound_body"] == case.body
    assert values["ordering_key"] is None  # a bad message holds no key back
    assert (row.identity is not None) == case.identified
    json.loads(values["payload"])
    json.loads(values["inbound_attributes"])
