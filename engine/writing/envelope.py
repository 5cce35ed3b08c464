"""What a handler or relay receives: one outbox event, decoded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from engine.context import TaskContext

_FROM_ROW: Any = object()  # from_row's default: the payload is the row's own


@dataclass(frozen=True, slots=True)
class EventEnvelope:
    """An outbox event as delivered: identity, routing, payload and task context."""

    event_id: str
    tenant_id: str
    event_type: str
    event_version: int
    aggregate_type: str
    aggregate_id: str
    payload: Mapping[str, Any]
    created_at: datetime
    attempt_count: int = 1
    max_attempts: int = 10
    claim_version: int = 0
    replay_count: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # The event whose handler published this one, and the first event of its chain (None
    # on a first event): see ``chain_id``.
    causation_id: str | None = None
    correlation_id: str | None = None
    # Events with the same key are delivered one at a time in write order (None:
    # unordered); the relay sends it as the CloudEvents ``partitionkey`` extension.
    ordering_key: str | None = None
    # The W3C trace context the event was published in (its outbox write's span, or an
    # inbound event's sender): its processing continues that trace (engine.tracing).
    traceparent: str | None = None
    tracestate: str | None = None
    # The payload's JSON text as stored, when the envelope was built from a row: the relay
    # sends it as is (a decode to floats and back would change numbers such as
    # 12345678901234567.89). Not an init field, so ``dataclasses.replace`` clears it
    # instead of pairing a new payload with the old text.
    raw_payload: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def actor_id(self) -> str | None:
        value = self.payload.get("actor_id")
        return None if value is None else str(value)

    @property
    def request_id(self) -> str | None:
        value = self.payload.get("request_id")
        return None if value is None else str(value)

    @property
    def trace_id(self) -> str | None:
        value = self.payload.get("trace_id")
        return None if value is None else str(value)

    @property
    def chain_id(self) -> str:
        """The first event of this event's chain: events its handlers publish carry it
        as their ``correlation_id``."""
        return self.correlation_id or self.event_id

    @property
    def is_first_attempt(self) -> bool:
        return self.attempt_count <= 1

    def task_context(self) -> TaskContext:
        """The context a handler of this event runs in (built when a handler asks for it)."""
        return TaskContext(
            self.tenant_id, self.actor_id or "", self.request_id or "", self.trace_id
        )

    @classmethod
    def from_row(cls, row: Mapping[Any, Any], payload: Any = _FROM_ROW) -> EventEnvelope:
        """Build from an ``outbox_events`` row mapping (``payload``: already decoded).

        Once per delivered event, so built by ``delivered_envelope`` (a subclass, which
        may have fields of its own, through its ``__init__``). The result is the same
        object ``cls(...)`` makes (a test holds them equal).
        """
        if payload is _FROM_ROW:
            payload = row["payload"]
        if type(payload) is not dict and not isinstance(payload, Mapping):
            raise TypeError(f"payload is {type(payload).__name__}, not a JSON object")
        values = (
            row["id"],
            row["tenant_id"],
            row["event_type"],
            int(row["event_version"]),
            row["aggregate_type"],
            row["aggregate_id"],
            payload,
            row["created_at"],
            int(row["attempt_count"]),
            int(row["max_attempts"]),
            int(row["claim_version"]),
            int(row.get("replay_count") or 0),
        )
        causes = (row.get("causation_id"), row.get("correlation_id"))
        key = row.get("ordering_key")
        trace = (row.get("traceparent"), row.get("tracestate"))
        if cls is not EventEnvelope:  # a subclass may have fields of its own
            return cls(*values, {}, *causes, key, *trace)
        return delivered_envelope(*values, None, *causes, key, *trace)


_new = object.__new__
# Each field's slot descriptor's __set__, in field order.
(_ID, _TENANT, _TYPE, _VERSION, _AGG_TYPE, _AGG_ID, _PAYLOAD, _CREATED, _ATTEMPTS, _MAX, _CLAIM,
 _REPLAYS, _METADATA, _CAUSATION, _CORRELATION, _KEY, _TRACEPARENT, _TRACESTATE, _RAW) = (
    EventEnvelope.__dict__[name].__set__ for name in EventEnvelope.__dataclass_fields__
)  # fmt: skip


def attach_raw_payload(envelope: EventEnvelope, raw_payload: str) -> None:
    """Give a freshly built envelope its payload's stored text (see ``raw_payload``)."""
    _RAW(envelope, raw_payload)


def delivered_envelope(
    event_id: str,
    tenant_id: str,
    event_type: str,
    event_version: int,
    aggregate_type: str,
    aggregate_id: str,
    payload: Mapping[str, Any],
    created_at: datetime,
    attempt_count: int,
    max_attempts: int,
    claim_version: int,
    replay_count: int,
    raw_payload: str | None = None,
    causation_id: str | None = None,
    correlation_id: str | None = None,
    ordering_key: str | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> EventEnvelope:
    """``EventEnvelope(...)`` with no metadata, for every event a dispatcher delivers.

    The fields go straight into their slots instead of through the frozen dataclass's
    ``__init__``, which sets each field through ``object.__setattr__``, and one
    call each instead of a loop over them (decision 0025).
    """
    envelope = _new(EventEnvelope)
    _ID(envelope, event_id)
    _TENANT(envelope, tenant_id)
    _TYPE(envelope, event_type)
    _VERSION(envelope, event_version)
    _AGG_TYPE(envelope, aggregate_type)
    _AGG_ID(envelope, aggregate_id)
    _PAYLOAD(envelope, payload)
    _CREATED(envelope, created_at)
    _ATTEMPTS(envelope, attempt_count)
    _MAX(envelope, max_attempts)
    _CLAIM(envelope, claim_version)
    _REPLAYS(envelope, replay_count)
    _METADATA(envelope, {})
    _CAUSATION(envelope, causation_id)
    _CORRELATION(envelope, correlation_id)
    _KEY(envelope, ordering_key)
    _TRACEPARENT(envelope, traceparent)
    _TRACESTATE(envelope, tracestate)
    _RAW(envelope, raw_payload)
    return envelope
