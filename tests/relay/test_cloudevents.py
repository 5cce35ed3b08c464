"""The CloudEvents 1.0 mapping: every attribute, the extension names, the traceparent rules."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from engine.relay.cloudevents import (
    encode_cloudevent,
    event_source,
    random_span_id,
    rfc3339,
    to_cloudevent,
    traceparent_for,
)
from engine.writing.envelope import EventEnvelope

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def envelope(**changes: object) -> EventEnvelope:
    values: dict[str, object] = {
        "event_id": "0190a8e0-0000-7000-8000-000000000001",
        "tenant_id": "acme",
        "event_type": "orders.placed",
        "event_version": 2,
        "aggregate_type": "order",
        "aggregate_id": "o-42",
        "payload": {"order_id": "o-42", "amount": 10, "trace_id": TRACE, "note": "café"},
        "created_at": datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    }
    values.update(changes)
    return EventEnvelope(**values)  # type: ignore[arg-type]


def test_every_attribute_of_the_structured_envelope() -> None:
    event = to_cloudevent(envelope(), source_prefix="/shop", new_span_id=lambda: SPAN)
    assert event == {
        "specversion": "1.0",
        "id": "0190a8e0-0000-7000-8000-000000000001",
        "source": "/shop/order",
        "type": "orders.placed",
        "subject": "order/o-42",
        "time": "2026-01-02T03:04:05.678901Z",
        "datacontenttype": "application/json",
        "tenantid": "acme",
        "eventversion": 2,
        "aggregatetype": "order",
        "aggregateid": "o-42",
        "traceid": TRACE,
        "traceparent": f"00-{TRACE}-{SPAN}-01",
        "data": {"order_id": "o-42", "amount": 10, "trace_id": TRACE, "note": "café"},
    }
    # CloudEvents: attribute names are lowercase a-z / 0-9 only (20 characters at most).
    assert all(re.fullmatch(r"[a-z0-9]{1,20}", name) for name in event)


def test_an_ordered_events_key_is_the_partitionkey_extension() -> None:
    """The receiving inbox restores it as the row's ordering key (engine.inbox.rows)."""
    assert to_cloudevent(envelope(ordering_key="order:o-42"))["partitionkey"] == "order:o-42"
    assert "partitionkey" not in to_cloudevent(envelope())


def test_default_source_prefix_and_escaping() -> None:
    assert to_cloudevent(envelope())["source"] == "/outbox/order"
    assert event_source("order line", "/shop/") == "/shop/order%20line"


def test_time_is_rfc3339_utc_whatever_the_input_zone() -> None:
    plus_two = timezone(timedelta(hours=2))
    assert rfc3339(datetime(2026, 1, 2, 5, 4, 5, tzinfo=plus_two)) == "2026-01-02T03:04:05Z"
    assert rfc3339(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05Z"  # naive = UTC
    event = to_cloudevent(envelope(created_at=datetime(2026, 1, 2, 5, 0, tzinfo=plus_two)))
    assert event["time"] == "2026-01-02T03:00:00Z"


def test_an_existing_w3c_traceparent_is_kept_as_is() -> None:
    parent = f"00-{TRACE}-{SPAN}-00"
    event = to_cloudevent(envelope(payload={"trace_id": parent}), new_span_id=lambda: "f" * 16)
    assert event["traceparent"] == parent
    assert event["traceid"] == parent


def test_a_bare_trace_id_gets_a_new_span_and_the_sampled_flag() -> None:
    event = to_cloudevent(envelope(payload={"trace_id": TRACE.upper()}))
    assert re.fullmatch(rf"00-{TRACE}-[0-9a-f]{{16}}-01", event["traceparent"])
    assert event["traceparent"][36:52] != "0" * 16
    assert event["traceid"] == TRACE.upper()  # the extension keeps the original value


def test_a_free_form_trace_id_keeps_traceid_but_no_traceparent() -> None:
    event = to_cloudevent(envelope(payload={"trace_id": "trace-abc"}))
    assert event["traceid"] == "trace-abc"
    assert "traceparent" not in event


def test_no_trace_id_means_neither_extension() -> None:
    event = to_cloudevent(envelope(payload={"order_id": "o-1"}))
    assert "traceid" not in event and "traceparent" not in event


@pytest.mark.parametrize(
    "value",
    [
        "0" * 32,  # all-zero trace id is invalid
        f"00-{'0' * 32}-{SPAN}-01",
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id is invalid
        f"01-{TRACE}-{SPAN}-01",  # only version 00 is understood
        f"00-{TRACE}-{SPAN}",  # truncated
        TRACE[:-1],  # 31 hex
        TRACE + "0",  # 33 hex
        "g" * 32,
        "",
        None,
    ],
)
def test_traceparent_is_omitted_for_anything_not_w3c(value: str | None) -> None:
    assert traceparent_for(value) is None


def test_random_span_ids_are_16_hex_and_vary() -> None:
    spans = {random_span_id() for _ in range(50)}
    assert len(spans) == 50
    assert all(re.fullmatch(r"[0-9a-f]{16}", s) and s != "0" * 16 for s in spans)


def test_encoded_once_as_compact_utf8_json() -> None:
    event = to_cloudevent(envelope(), new_span_id=lambda: SPAN)
    body = encode_cloudevent(event)
    assert json.loads(body) == event
    assert b"caf\xc3\xa9" in body and b": " not in body
    with pytest.raises(ValueError):
        encode_cloudevent({"data": float("nan")})
