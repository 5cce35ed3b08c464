"""The dispatcher's public types: what a round did, and the parts a user can plug in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

from engine.writing.envelope import EventEnvelope


@dataclass(frozen=True, slots=True)
class DispatchResult:
    """What one round did. ``lost_leases`` counts completions the fence refused."""

    claimed: int = 0
    published: int = 0
    failed: int = 0
    dead_lettered: int = 0
    lost_leases: int = 0

    def __add__(self, other: DispatchResult) -> DispatchResult:
        return DispatchResult(
            self.claimed + other.claimed,
            self.published + other.published,
            self.failed + other.failed,
            self.dead_lettered + other.dead_lettered,
            self.lost_leases + other.lost_leases,
        )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(slots=True)
class ExternalPublishResult:
    """What an external publisher did with the envelopes it was given.

    ``failed`` maps event ids to an error (retried with backoff); ids in
    ``unattempted`` were not sent at all (the round stopped, for example the
    broker went away) and go back without spending an attempt. Any id in none
    of the three sets is treated as failed. ``unavailable``: ids of ``failed``
    whose failure was the broker being away, not the event; such a failure is
    retried with backoff like any other but never spends an event's last
    attempt, so an outage, however long, dead-letters nothing.
    """

    published: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    unattempted: set[str] = field(default_factory=set)
    unavailable: set[str] = field(default_factory=set)


class ExternalPublisher(Protocol):
    """Delivers events somewhere else (a broker) instead of calling local handlers.

    It may also have ``async def ready() -> bool`` (a circuit breaker: the
    dispatcher claims nothing while it answers False), ``waiting_reason: str |
    None`` (shown in heartbeats) and ``async def prepare(envelopes)`` (a batch
    claimed ahead, likely the next ``publish``: work it can do early), as the
    RabbitMQ relay does.
    """

    async def publish(self, envelopes: Sequence[EventEnvelope]) -> ExternalPublishResult: ...


class LockProvider(Protocol):
    """A coarse cross-process lock taken around each claim round (optional)."""

    async def acquire(self) -> bool: ...

    async def release(self) -> None: ...


class DispatchObserver(Protocol):
    """Told about every round (metrics)."""

    async def observe_round(self, result: DispatchResult) -> None: ...
