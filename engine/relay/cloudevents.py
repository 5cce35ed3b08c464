"""Map an outbox event to a CloudEvents 1.0 structured-mode JSON envelope.

Pure functions (the random span id of a built ``traceparent`` is injectable),
so the mapping is unit-tested without a broker. Attribute choices:

* ``source`` is ``<source_prefix>/<aggregate_type>`` (default prefix
  ``/outbox``, so ``/outbox/order``): the prefix names the producing service,
  the aggregate type the context the event happened in. ``source`` + ``id``
  is unique because ``id`` is the outbox event id (a UUIDv7).
* ``subject`` is ``<aggregate_type>/<aggregate_id>``; ``time`` is the row's
  ``created_at`` in RFC 3339 UTC; ``data`` is the payload as stored.
* Extensions (lowercase alphanumeric names, as the spec requires):
  ``tenantid``, ``eventversion``, ``aggregatetype``, ``aggregateid``,
  ``traceid`` (the payload's ``trace_id`` as is) and the distributed-tracing
  extension's ``traceparent`` and ``tracestate`` (W3C Trace Context): the relay's
  publish span's context when tracing is on, else the event's stored context
  (its columns), else one derived from that trace id (``trace_context``).
* ``partitionkey`` (the CloudEvents partitioning extension) is an ordered event's
  ``ordering_key``: the receiving inbox (engine.inbox) restores it as the row's key,
  so the receiving dispatchers keep the per-key order.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from engine.tracing.propagation import TraceContext, parse_traceparent
from engine.writing.envelope import EventEnvelope

SPEC_VERSION = "1.0"
CONTENT_TYPE = "application/cloudevents+json"
DATA_CONTENT_TYPE = "application/json"
DEFAULT_SOURCE_PREFIX = "/outbox"

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_TRACE_ID = re.compile(r"[0-9a-f]{32}")


def random_span_id() -> str:
    """A fresh W3C parent id: 16 lowercase hex characters, never all zeros."""
    while True:
        span = secrets.token_hex(8)
        if span != "0" * 16:
            return span


def traceparent_for(
    trace_id: str | None, new_span_id: Callable[[], str] = random_span_id
) -> str | None:
    """A W3C ``traceparent`` for ``trace_id``, or None when it is not a W3C trace id.

    A complete version-00 traceparent is kept as is; a bare 32-hex trace id gets
    a new parent (span) id and the sampled flag. All-zero ids are invalid per
    the W3C spec and give None, as does anything else (a free-form trace id).
    """
    if not trace_id:
        return None
    value = trace_id.strip().lower()
    full = _TRACEPARENT.fullmatch(value)
    if full:
        if full.group(1) == "0" * 32 or full.group(2) == "0" * 16:
            return None
        return value
    if _TRACE_ID.fullmatch(value) and value != "0" * 32:
        return f"00-{value}-{new_span_id()}-01"
    return None


def trace_context(
    envelope: EventEnvelope, new_span_id: Callable[[], str] = random_span_id
) -> TraceContext | None:
    """The context an event's message carries when the relay makes no span of its own: the
    one stored with the event (when it is a valid traceparent), else one built from the
    payload's ``trace_id`` (``traceparent_for``), else none."""
    if envelope.traceparent and parse_traceparent(envelope.traceparent) is not None:
        return TraceContext(envelope.traceparent, envelope.tracestate or None)
    derived = traceparent_for(envelope.trace_id, new_span_id)
    return None if derived is None else TraceContext(derived)


def rfc3339(moment: datetime) -> str:
    """``moment`` in UTC as RFC 3339 with a ``Z`` suffix (naive values are taken as UTC)."""
    utc = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return utc.isoformat().replace("+00:00", "Z")


@functools.lru_cache(maxsize=1024)  # a handful of aggregate types, quoted once each
def event_source(aggregate_type: str, source_prefix: str = DEFAULT_SOURCE_PREFIX) -> str:
    """The CloudEvents ``source`` URI-reference: ``<prefix>/<aggregate_type>``."""
    return f"{source_prefix.rstrip('/')}/{quote(aggregate_type, safe='')}"


def to_cloudevent(
    envelope: EventEnvelope,
    *,
    source_prefix: str = DEFAULT_SOURCE_PREFIX,
    new_span_id: Callable[[], str] = random_span_id,
    data: bool = True,
    trace: TraceContext | None = None,
) -> dict[str, Any]:
    """The CloudEvents 1.0 structured envelope of ``envelope`` (a JSON-ready dict);
    without ``data`` when ``data`` is false (``encode_cloudevent`` adds it). ``trace``:
    the context to carry (the relay's span's); by default ``trace_context(envelope)``."""
    event: dict[str, Any] = {
        "specversion": SPEC_VERSION,
        "id": envelope.event_id,
        "source": event_source(envelope.aggregate_type, source_prefix),
        "type": envelope.event_type,
        "subject": f"{envelope.aggregate_type}/{envelope.aggregate_id}",
        "time": rfc3339(envelope.created_at),
        "datacontenttype": DATA_CONTENT_TYPE,
        "tenantid": envelope.tenant_id,
        "eventversion": envelope.event_version,
        "aggregatetype": envelope.aggregate_type,
        "aggregateid": envelope.aggregate_id,
    }
    if envelope.ordering_key is not None:
        event["partitionkey"] = envelope.ordering_key
    trace_id = envelope.trace_id
    if trace_id:
        event["traceid"] = trace_id
    if trace is None:
        trace = trace_context(envelope, new_span_id)
    if trace is not None:
        event["traceparent"] = trace.traceparent
        if trace.tracestate:
            event["tracestate"] = trace.tracestate
    if data:
        event["data"] = dict(envelope.payload)
    return event


# Built once: json.dumps with options builds an encoder per call, which cost more than
# encoding a small event (see decision 0025).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def encode_cloudevent(event: Mapping[str, Any], raw_data: str | None = None) -> bytes:
    """Compact UTF-8 JSON: the message body, encoded once per message.

    ``raw_data``: the payload's JSON text as stored, written as the ``data`` member as it
    is, after the attributes of ``event`` (which then has no ``data`` of its own).
    """
    text = _ENCODER.encode(event)
    if raw_data is not None:
        text = f'{text[:-1]},"data":{raw_data}}}'
    return text.encode()
