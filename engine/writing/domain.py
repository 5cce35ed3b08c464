"""Domain events recorded by aggregates, written to the outbox by the unit of work.

An aggregate says what happened (``order.record_event(OrderPlaced(...))``); the
registry says what each event class is called on the wire; the unit of work
turns pending events into outbox rows just before it commits. Business code
writes no publishing code at all.
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import uuid
from collections.abc import Mapping
from datetime import date, datetime
from typing import Any, ClassVar

from pydantic import BaseModel
from sqlalchemy import event
from sqlalchemy.orm import Session, object_session

from engine.errors import DomainEventError
from engine.writing.models import payload_of

DEFAULT_BUFFER_CAPACITY = 256
_TRACKED = "outbox_aggregates"


def _track(session: Session, aggregate: object) -> None:
    """Hold a strong reference until commit.

    SQLAlchemy's identity map holds unmodified objects weakly; an aggregate that
    recorded an event but went out of scope in the caller must not be
    garbage-collected (with its events) before the unit of work commits.
    """
    session.info.setdefault(_TRACKED, {})[id(aggregate)] = aggregate


def tracked_aggregates(session: Session) -> list[Any]:
    """Aggregates with recorded events that joined ``session`` (see ``_track``)."""
    return list(session.info.get(_TRACKED, {}).values())


@event.listens_for(Session, "after_attach")
def _on_attach(session: Session, instance: object) -> None:
    if has_pending_events(instance):
        _track(session, instance)


class DomainEventBuffer:
    """A bounded list of events an aggregate has recorded but not yet published."""

    __slots__ = ("_capacity", "_items")

    def __init__(self, capacity: int = DEFAULT_BUFFER_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._items: list[Any] = []

    def add(self, event: Any) -> None:
        if len(self._items) >= self._capacity:
            raise DomainEventError(
                f"domain event buffer is full ({self._capacity} events): an aggregate must not "
                "record more events than that in one unit of work"
            )
        self._items.append(event)

    @property
    def items(self) -> tuple[Any, ...]:
        return tuple(self._items)

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


class AggregateRoot:
    """Mixin for aggregates (usually SQLAlchemy mapped classes) that record domain events.

    The buffer is created lazily because SQLAlchemy does not call ``__init__``
    when it loads an object from the database.
    """

    domain_event_capacity: ClassVar[int] = DEFAULT_BUFFER_CAPACITY

    @property
    def _domain_event_buffer(self) -> DomainEventBuffer:
        buffer: DomainEventBuffer | None = self.__dict__.get("_outbox_domain_events")
        if buffer is None:
            buffer = DomainEventBuffer(self.domain_event_capacity)
            self.__dict__["_outbox_domain_events"] = buffer
        return buffer

    def record_event(self, event: Any) -> None:
        """Record that ``event`` happened; it is published when the unit of work commits."""
        self._domain_event_buffer.add(event)
        session = object_session(self)
        if session is not None:
            _track(session, self)

    @property
    def domain_events(self) -> tuple[Any, ...]:
        return self._domain_event_buffer.items

    def clear_domain_events(self) -> None:
        self._domain_event_buffer.clear()


def has_pending_events(obj: object) -> bool:
    buffer = obj.__dict__.get("_outbox_domain_events") if hasattr(obj, "__dict__") else None
    return isinstance(obj, AggregateRoot) and buffer is not None and len(buffer) > 0


def event_payload(event: Any) -> dict[str, Any]:
    """A domain event as a JSON object: dataclasses, pydantic models, ``to_payload()`` or
    mappings."""
    if isinstance(event, BaseModel):
        return payload_of(event)
    if hasattr(event, "to_payload"):
        raw = event.to_payload()
    elif dataclasses.is_dataclass(event) and not isinstance(event, type):
        raw = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    elif isinstance(event, Mapping):
        raw = dict(event)
    else:
        raise DomainEventError(
            f"cannot serialise domain event {type(event).__qualname__}: "
            "use a dataclass or give it a to_payload() method"
        )
    return {str(k): _jsonable(v) for k, v in raw.items()}


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return value
