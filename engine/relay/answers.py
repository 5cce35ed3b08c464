"""What the broker's answer to one publish means: confirmed, the event's own failure, or
the broker's (an outage, which spends no event's last attempt).

Unroutable (``mandatory``, returned with 312 NO_ROUTE) is the event's failure, never
published. A nack (RabbitMQ sends one only when a queue cannot take the message: at its
``x-max-length`` with ``x-overflow: reject-publish``, or a queue process that failed) and
a refusal of access (403 ACCESS_REFUSED, on the exchange or, under topic permissions, on
one routing key) are the broker's settings or state, not the event's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiormq.abc import DeliveredMessage
from aiormq.exceptions import (
    AMQPError,
    ChannelAccessRefused,
    ChannelInvalidStateError,
    DeliveryError,
    PublishError,
)
from pamqp.commands import Basic

from engine.relay.circuit import UNAVAILABLE


class NotConfirmed(Exception):
    """The broker answered a publish with something other than an ack."""


class Refused(Exception):
    """The broker closed the channel over this one message (sent alone)."""


class Outage(Exception):
    """The broker went away during a publish call (carries the error text).

    ``sent``: whether any publish of the call may have reached the broker; when
    False (the connect failed), the whole call goes back unattempted. ``refused``:
    the broker is up but refuses this relay's publishes (access refused).
    """

    def __init__(self, error: str, *, sent: bool, refused: bool = False) -> None:
        super().__init__(error)
        self.sent = sent
        self.refused = refused


def confirmation_problem(task: asyncio.Task[Any]) -> BaseException | None:
    """None when the broker acked the publish; otherwise what went wrong."""
    if task.cancelled():
        return asyncio.CancelledError()
    exc = task.exception()
    if exc is not None:
        return exc
    confirmation = task.result()
    if isinstance(confirmation, DeliveredMessage):  # returned although on_return_raises
        return PublishError(confirmation, confirmation.delivery)
    if not isinstance(confirmation, Basic.Ack):
        return NotConfirmed(f"not confirmed by the broker ({confirmation!r})")
    return None


def describe(
    exc: BaseException,
    routing_key: str,
    *,
    exchange: str,
    confirm_timeout: float,
    detail: Callable[[BaseException], str],
) -> tuple[str, bool]:
    """The error text for a failed publish and whether it means an outage.

    ``detail`` renders an error with the broker's password masked.
    """
    if isinstance(exc, PublishError):
        delivery = exc.message.delivery if exc.message is not None else None
        code = getattr(delivery, "reply_code", 312)
        text = getattr(delivery, "reply_text", "NO_ROUTE")
        return (
            f"unroutable: no queue bound for routing key {routing_key} on "
            f"exchange {exchange} ({code} {text})",
            False,
        )
    if isinstance(exc, DeliveryError):  # a nack: the broker's state, not the message's
        frame = getattr(exc.frame, "name", type(exc.frame).__name__)
        return (
            f"{UNAVAILABLE}: the broker rejected the publish ({frame}): a queue at its "
            "x-max-length with x-overflow reject-publish, or a queue that failed",
            True,
        )
    if isinstance(exc, NotConfirmed):
        return str(exc), False
    if isinstance(exc, Refused):
        return f"refused by the broker: {exc}", False
    if isinstance(exc, TimeoutError):
        return f"{UNAVAILABLE}: no publisher confirm within {confirm_timeout:g} s", True
    if isinstance(exc, AMQPError | ChannelInvalidStateError | OSError | asyncio.CancelledError):
        return f"{UNAVAILABLE}: {detail(exc)}", True
    return f"cannot publish: {detail(exc)}", False


def refused_publish(exc: BaseException) -> bool:
    """A publish the broker, up and taking others, may refuse alone: a nack (its queue is
    full) or access refused (its routing key, under topic permissions)."""
    nacked = isinstance(exc, DeliveryError) and not isinstance(exc, PublishError)
    return nacked or isinstance(exc, ChannelAccessRefused)


def is_refusal(exc: BaseException) -> bool:
    """Whether the broker, reachable, did not take the publish: access refused, a nack,
    or no confirm in time (a resource alarm). Every probe may connect then, so such an
    outage ends with a confirmed publish."""
    return refused_publish(exc) or isinstance(exc, TimeoutError)
