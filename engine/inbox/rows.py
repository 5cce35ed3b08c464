"""What an arriving message becomes: the values of its ``outbox_events`` row.

A decoded CloudEvent becomes a ``pending`` row the receiving service's dispatchers deliver
like any local event. Its ``id`` is a new local id (a UUIDv7), so local and inbound ids
never collide; the CloudEvents identity goes into ``inbound_source`` and ``inbound_id``,
the queue into ``inbound_queue``, the trace context into ``traceparent`` and
``tracestate`` (the CloudEvent's, else the AMQP headers' of those names), and every other
attribute into ``inbound_attributes``:

- ``event_type`` = ``type``; ``event_version`` = the ``eventversion`` extension (1 without);
- ``tenant_id`` = the ``tenantid`` extension, else ``data``'s ``tenant_id``, else the
  consumer's default tenant;
- ``aggregate_type`` / ``aggregate_id`` = the ``aggregatetype`` / ``aggregateid``
  extensions (what engine.relay sends), else ``inbound`` and the ``subject`` (or ``id``);
- ``payload`` = ``data``, with the context fields a handler expects filled in where
  ``data`` lacks them: ``tenant_id``, ``actor_id`` (the ``actorid`` extension, else the
  source), ``request_id`` (the ``requestid`` extension, else the id) and ``trace_id``
  (the ``traceid`` extension, when there is one);
- ``ordering_key`` = the ``partitionkey`` extension (engine.relay puts an ordered
  event's key there), else the key this service's registry declares for the type.

A message that cannot be one (``Undecodable``, or an extension that does not fit its
column) becomes a ``dead_letter`` row of type ``inbox.undecodable`` (or its own type when
it was read), without an ordering key (it must not hold a key back), with the reason,
the raw body as received and the AMQP properties in its payload (``{"amqp": ...}``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from engine.clock import Clock, utc_now, uuid7
from engine.errors import EventValidationError
from engine.inbox.decoding import (
    Decoded,
    InboundEvent,
    ReceivedMessage,
    Undecodable,
    storable_text,
    unstorable_text,
)
from engine.storage.schema import DEAD_LETTER, PENDING, TRACEPARENT_LENGTH
from engine.writing.registry import MAX_ORDERING_KEY_LENGTH, EventRegistry

log = logging.getLogger("engine.inbox")

UNDECODABLE_TYPE = "inbox.undecodable"
INBOUND_AGGREGATE_TYPE = "inbound"
TENANT_LENGTH = 128  # outbox_events.tenant_id
AGGREGATE_LENGTH = 200  # outbox_events.aggregate_type, aggregate_id
MAX_VERSION = 2**31 - 1
# W3C Trace Context: version 00 is exactly this; a later version may append "-..." fields.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# The columns every inbound row writes, in the writer's order.
COLUMNS = (
    "id",
    "tenant_id",
    "event_type",
    "event_version",
    "aggregate_type",
    "aggregate_id",
    "payload",
    "ordering_key",
    "status",
    "last_error",
    "dead_letter_reason",
    "traceparent",
    "tracestate",
    "inbound_source",
    "inbound_id",
    "inbound_queue",
    "inbound_attributes",
    "inbound_body",
    "created_at",
)
RowKind = Literal["event", "unknown_type", "dead_letter"]


@dataclass(frozen=True, slots=True)
class InboundRow:
    """One row to insert (``values`` in ``COLUMNS`` order; payload and attributes as JSON
    text) and what it is: a deliverable event, one of a type this service does not know,
    or a dead letter (``reason`` says why)."""

    values: tuple[Any, ...]
    kind: RowKind
    identity: tuple[str, str] | None
    reason: str | None = None

    @property
    def event_id(self) -> str:
        return str(self.values[0])

    @property
    def event_type(self) -> str:
        return str(self.values[2])


class RowBuilder:
    """Rows for the messages of one queue, against this service's ``registry``."""

    def __init__(
        self,
        registry: EventRegistry,
        *,
        queue: str,
        default_tenant: str = "",
        clock: Clock = utc_now,
    ) -> None:
        self.registry = registry
        self.queue = queue
        self.default_tenant = default_tenant
        self.clock = clock
        self._known_types = {event_type for event_type, _ in registry.event_types()}
        self._warned: set[str] = set()

    def row(self, message: ReceivedMessage, decoded: Decoded) -> InboundRow:
        if isinstance(decoded, Undecodable):
            return self.dead_letter(message, decoded)
        try:
            return self._event_row(decoded, message.headers)
        except _Unfit as unfit:
            attributes = {"id": decoded.id, "source": decoded.source, "type": decoded.type}
            refused = Undecodable(
                str(unfit), decoded.id, decoded.source, decoded.type,
                {**attributes, **decoded.attributes},
            )  # fmt: skip
            return self.dead_letter(message, refused)

    def _event_row(self, event: InboundEvent, headers: Mapping[str, Any]) -> InboundRow:
        attributes = dict(event.attributes)
        tenant = _tenant(attributes, event.data, self.default_tenant)
        aggregate_type = _text_attribute(attributes, "aggregatetype", AGGREGATE_LENGTH)
        aggregate_id = _text_attribute(attributes, "aggregateid", AGGREGATE_LENGTH)
        if aggregate_type is None:
            aggregate_type = INBOUND_AGGREGATE_TYPE
        if aggregate_id is None:
            subject = attributes.get("subject")
            fits = isinstance(subject, str) and 0 < len(subject) <= AGGREGATE_LENGTH
            aggregate_id = str(subject) if fits else event.id
        payload = dict(event.data) if event.data is not None else {}
        payload.setdefault("tenant_id", tenant)
        payload.setdefault("actor_id", _context(attributes, "actorid", event.source))
        payload.setdefault("request_id", _context(attributes, "requestid", event.id))
        trace_id = attributes.get("traceid")
        if isinstance(trace_id, str) and trace_id:
            payload.setdefault("trace_id", trace_id)
        try:
            payload_text = _ENCODER.encode(payload)
        except ValueError as exc:
            raise _Unfit(f"data is not JSON: {exc}") from None
        problem = unstorable_text(payload_text)
        if problem is not None:
            raise _Unfit(f"data {problem}")
        version = _version(attributes)
        key = self._ordering_key(attributes, event.type, aggregate_type, aggregate_id, payload)
        traceparent, tracestate = _trace_context(attributes)
        if traceparent is None and "traceparent" not in attributes:
            traceparent, tracestate = _header_trace_context(headers)
        known = event.type in self._known_types
        if not known and event.type not in self._warned:
            self._warned.add(event.type)
            log.warning(
                "queue %s: event type %s is not registered here: stored, it waits as an "
                "unserved type until a dispatcher serves it",
                self.queue,
                event.type,
            )
        values = (
            uuid7(),
            tenant,
            event.type,
            version,
            aggregate_type,
            aggregate_id,
            payload_text,
            key,
            PENDING,
            None,
            None,
            traceparent,
            tracestate,
            event.source,
            event.id,
            self.queue,
            _ENCODER.encode(attributes),
            None,
            self.clock(),
        )
        return InboundRow(values, "event" if known else "unknown_type", (event.source, event.id))

    def dead_letter(self, message: ReceivedMessage, why: Undecodable) -> InboundRow:
        """The dead-lettered row of a message that cannot be delivered: raw body kept."""
        reason = f"inbox: {why.reason}"
        identity = (why.source, why.id) if why.source and why.id else None
        tenant = why.attributes.get("tenantid")
        if not isinstance(tenant, str) or len(tenant) > TENANT_LENGTH:
            tenant = self.default_tenant
        values = (
            uuid7(),
            tenant,
            why.type or UNDECODABLE_TYPE,
            1,
            INBOUND_AGGREGATE_TYPE,
            why.id or storable_text(message.message_id or "")[:AGGREGATE_LENGTH],
            _ENCODER.encode({"amqp": message.properties()}),
            None,
            DEAD_LETTER,
            reason,
            f"permanent: {reason}",
            None,
            None,
            identity[0] if identity else None,
            identity[1] if identity else None,
            self.queue,
            _ENCODER.encode(why.attributes),
            message.body,
            self.clock(),
        )
        return InboundRow(values, "dead_letter", identity, why.reason)

    def _ordering_key(
        self,
        attributes: Mapping[str, Any],
        event_type: str,
        aggregate_type: str,
        aggregate_id: str,
        payload: Mapping[str, Any],
    ) -> str | None:
        key = attributes.get("partitionkey")
        if key is not None:
            if not isinstance(key, str) or not key:
                raise _Unfit("extension partitionkey must be a non-empty string")
            if len(key) > MAX_ORDERING_KEY_LENGTH:
                raise _Unfit(
                    f"extension partitionkey is longer than {MAX_ORDERING_KEY_LENGTH} characters"
                )
            return key
        try:
            return self.registry.ordering_key_for(event_type, aggregate_type, aggregate_id, payload)
        except EventValidationError as exc:
            raise _Unfit(f"ordering key: {exc}") from None
        except Exception as exc:  # the registry's key function is the app's code
            raise _Unfit(f"ordering key: {type(exc).__name__}: {exc}") from None


class _Unfit(Exception):
    """A decoded event that does not fit its row (the message says why)."""


def _tenant(attributes: Mapping[str, Any], data: Mapping[str, Any] | None, default: str) -> str:
    tenant = attributes.get("tenantid")
    if tenant is None and data is not None and isinstance(data.get("tenant_id"), str):
        tenant = data["tenant_id"]
    if tenant is None:
        return default
    if not isinstance(tenant, str):
        raise _Unfit("extension tenantid must be a string")
    if len(tenant) > TENANT_LENGTH:
        raise _Unfit(f"tenant id is longer than {TENANT_LENGTH} characters")
    return tenant


def _text_attribute(attributes: Mapping[str, Any], name: str, limit: int) -> str | None:
    """An extension that names a column's value: text (an integer is written as text)."""
    value = attributes.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise _Unfit(f"extension {name} must be a non-empty string")
    text = str(value)
    if len(text) > limit:
        raise _Unfit(f"extension {name} is longer than {limit} characters")
    return text


def _context(attributes: Mapping[str, Any], name: str, fallback: str) -> str:
    value = attributes.get(name)
    return value if isinstance(value, str) and value else fallback


def _version(attributes: Mapping[str, Any]) -> int:
    value = attributes.get("eventversion")
    if value is None:
        return 1
    if isinstance(value, str) and value.isdecimal():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_VERSION:
        raise _Unfit(f"extension eventversion must be an integer from 1 to {MAX_VERSION}")
    return value


def _trace_context(attributes: dict[str, Any]) -> tuple[str | None, str | None]:
    """W3C ``traceparent`` and ``tracestate``, moved out of ``attributes`` into their
    columns when the traceparent is valid; an invalid one (and its tracestate, as the
    W3C spec says) stays among the attributes and the row carries none."""
    parent = attributes.get("traceparent")
    if not isinstance(parent, str) or not valid_traceparent(parent):
        return None, None
    state = attributes.get("tracestate")
    del attributes["traceparent"]
    if isinstance(state, str):
        del attributes["tracestate"]
        return parent, state or None
    return parent, None


def _header_trace_context(headers: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The W3C context of the AMQP headers ``traceparent`` and ``tracestate`` (where
    OpenTelemetry's AMQP instrumentations put it), for a CloudEvent that carries none."""
    parent, state = (_header_text(headers.get(name)) for name in ("traceparent", "tracestate"))
    if parent is None or not valid_traceparent(parent):
        return None, None
    return parent, state or None


def _header_text(value: Any) -> str | None:
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def valid_traceparent(value: str) -> bool:
    """A W3C traceparent: lower-case hex fields, no all-zero ids, version ``ff`` invalid,
    version 00 exactly 55 characters."""
    found = _TRACEPARENT.fullmatch(value)
    if found is None or len(value) > TRACEPARENT_LENGTH:
        return False
    version, trace_id, parent_id, _flags, extra = found.groups()
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        return False
    return not (version == "00" and extra is not None)
