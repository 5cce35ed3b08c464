"""A consumer's totals and its heartbeat row (``kind = "consumer"``), beside the dispatchers'.

The row is ``engine.running.heartbeat.Heartbeat``'s, so ``stats``, the console and the
heartbeat purge treat consumers as they treat dispatchers; ``details`` says what a
consumer does: its queue and bindings, what it received, stored, dropped as duplicates
and dead-lettered, and what it waits for (the broker or the database) during an outage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CONSUMER_KIND = "consumer"


@dataclass(slots=True)
class ConsumerTotals:
    """What one consumer run did so far.

    ``received``: messages taken into a batch (a redelivered one counts again, and so
    does a batch tried again after a storage error only once);
    ``stored``: rows inserted (events, events of unknown types and dead letters);
    ``duplicates``: messages whose (source, id) was stored already; ``rejected``: messages
    stored dead-lettered (they could not be decoded); ``unknown_types``: events stored
    whose type this service does not register (they wait as unserved types); ``acked``:
    messages acked after their batch committed; ``storage_errors``: writes the database
    refused (the batch is tried again, unacked); ``reconnects``: connections to the
    broker opened after the first.
    """

    received: int = 0
    stored: int = 0
    duplicates: int = 0
    rejected: int = 0
    unknown_types: int = 0
    acked: int = 0
    batches: int = 0
    storage_errors: int = 0
    reconnects: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class ConsumerSummary:
    """A finished run: its totals, whether a stop was asked for, and its last error."""

    totals: ConsumerTotals
    shutdown_requested: bool = False
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.totals.as_dict(),
            "shutdown_requested": self.shutdown_requested,
            "last_error": self.last_error,
        }


def consumer_details(
    *,
    queue: str,
    bindings: Sequence[str],
    prefetch: int,
    max_batch: int,
    totals: ConsumerTotals,
    waiting_for: str | None,
    last_error: str | None,
    heartbeat_seconds: float,
) -> dict[str, Any]:
    """The ``details`` of a consumer's heartbeat row (docs/inbox.md lists the keys)."""
    return {
        "queue": queue,
        "bindings": list(bindings),
        "prefetch": prefetch,
        "max_batch": max_batch,
        "totals": totals.as_dict(),
        "waiting_for": waiting_for,
        "last_error": last_error,
        "heartbeat_seconds": heartbeat_seconds,
    }
