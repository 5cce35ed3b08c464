"""Transactional handlers: a handler's writes commit with its run record and its events.

A handler registered with ``transactional=True`` is called as ``handler(envelope,
session)``. The dispatcher opens one transaction on the outbox's database for it; what
the handler writes through ``session``, the events it publishes through
``OutboxEventPublisher(session)`` (or records on aggregates in that session) and the
record that it ran commit together, and only while this dispatcher's claim on the event
still holds. So a redelivery finds the record and runs nothing twice: effects in the
outbox's database happen exactly once.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from engine.errors import EventRegistrationError, OutboxTransactionError
from engine.writing.envelope import EventEnvelope

TransactionalHandler = Callable[[EventEnvelope, AsyncSession], Awaitable[Any]]

_OWNED = (
    "the dispatcher commits a transactional handler's session (with the handler's run "
    "record and its events) once the handler returns; the handler must not {} it"
)


class HandlerSession(AsyncSession):
    """The session a transactional handler writes through; the dispatcher ends it.

    ``commit``, ``rollback`` and ``close`` raise ``OutboxTransactionError``: a handler
    that ended the transaction itself would split its writes from its run record. The
    error fails the delivery, and the dispatcher rolls everything back.
    """

    async def commit(self) -> None:
        raise OutboxTransactionError(_OWNED.format("commit"))

    async def rollback(self) -> None:
        raise OutboxTransactionError(_OWNED.format("roll back"))

    async def close(self) -> None:
        raise OutboxTransactionError(_OWNED.format("close"))

    async def release(self) -> None:
        """End the session (the dispatcher's call, after its commit or rollback)."""
        await AsyncSession.close(self)


def check_signature(event_type: str, key: str, handler: Any, transactional: bool) -> None:
    """Refuse, at registration, a handler that cannot take the arguments it will get:
    ``(envelope)`` for a plain handler, ``(envelope, session)`` for a transactional one."""
    if not callable(handler):
        raise EventRegistrationError(f"handler {key!r} of {event_type} is not callable")
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        return  # a builtin or C callable: nothing to check against
    takes_one = _binds(signature, 1)
    takes_two = _binds(signature, 2)
    if transactional and not takes_two:
        raise EventRegistrationError(
            f"handler {key!r} of {event_type} is transactional: it must take "
            f"(envelope, session), but its signature is {signature}"
        )
    if not transactional and not takes_one:
        hint = " (register it with transactional=True)" if takes_two else ""
        raise EventRegistrationError(
            f"handler {key!r} of {event_type} must take (envelope), but its signature is "
            f"{signature}{hint}"
        )


def _binds(signature: inspect.Signature, count: int) -> bool:
    try:
        signature.bind(*(object() for _ in range(count)))
    except TypeError:
        return False
    return True
