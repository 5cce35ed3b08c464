"""Delivering events: claim a batch under a lease, run its handlers, write fenced outcomes.

``OutboxDispatcher`` (``dispatcher``) is made of small pieces, each handed only what it
uses: ``claimer`` and ``claim_sql`` claim, ``decoding`` turns rows into envelopes,
``delivery`` and ``handlers`` run local handlers, ``relaying`` hands events to a broker,
``completions`` and ``fenced_writes`` record outcomes, and ``round`` ties one round
together. ``types`` holds what users plug in.
"""

from engine.dispatch.dispatcher import (
    CONCURRENCY_PER_BATCH,
    MAX_BATCH_SIZE,
    OutboxDispatcher,
    default_dispatcher_id,
)
from engine.dispatch.types import (
    DispatchObserver,
    DispatchResult,
    ExternalPublisher,
    ExternalPublishResult,
    LockProvider,
)

__all__ = [
    "CONCURRENCY_PER_BATCH",
    "MAX_BATCH_SIZE",
    "DispatchObserver",
    "DispatchResult",
    "ExternalPublishResult",
    "ExternalPublisher",
    "LockProvider",
    "OutboxDispatcher",
    "default_dispatcher_id",
]
