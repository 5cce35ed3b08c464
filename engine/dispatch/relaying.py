"""Delivering a round's rows to an external publisher (a broker relay) instead of handlers."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from engine.clock import Clock, utc_now
from engine.dispatch.claimed import ClaimedRow, Outcome
from engine.dispatch.probe import DeliveryObserver, observe_relayed
from engine.dispatch.types import ExternalPublisher
from engine.writing.envelope import EventEnvelope

log = logging.getLogger("engine.dispatcher")


class Relaying:
    """The dispatcher's view of an ``ExternalPublisher``: its optional circuit breaker
    (``ready``), what it waits for, early work on a batch, and outcomes per row, which
    ``observers`` are told about (engine.dispatch.probe)."""

    def __init__(
        self,
        publisher: ExternalPublisher,
        observers: Sequence[DeliveryObserver] = (),
        clock: Clock = utc_now,
    ) -> None:
        self.publisher = publisher
        self.observers = observers
        self.clock = clock

    async def ready(self) -> bool:
        """False while the publisher's circuit is open: claim nothing, spend nothing."""
        ready = getattr(self.publisher, "ready", None)
        return ready is None or bool(await ready())

    @property
    def waiting_for(self) -> str | None:
        """What the publisher waits for (a broker outage), if anything."""
        reason = getattr(self.publisher, "waiting_reason", None)
        return reason if isinstance(reason, str) else None

    @property
    def prepares(self) -> bool:
        """Whether the publisher can build a batch's messages ahead (``prepare``)."""
        return getattr(self.publisher, "prepare", None) is not None

    async def prepare(self, envelopes: Sequence[EventEnvelope]) -> None:
        """Let the publisher build the next batch's messages ahead.

        Only a speed-up: if anything goes wrong here, ``publish`` builds them itself.
        """
        prepare = getattr(self.publisher, "prepare", None)
        if prepare is None:
            return
        try:
            await prepare(envelopes)
        except Exception as exc:
            log.debug("preparing the next batch ahead failed: %s", type(exc).__name__)

    async def relay(
        self, rows: list[ClaimedRow], envelopes: Mapping[str, EventEnvelope]
    ) -> list[Outcome]:
        """Publish ``rows``; every row gets an outcome, whatever the publisher does."""
        if not rows:
            return []
        started = self.clock()
        outcomes = await self._relay(rows, envelopes)
        if self.observers:
            observe_relayed(self.observers, outcomes, envelopes, started)
        return outcomes

    async def _relay(
        self, rows: list[ClaimedRow], envelopes: Mapping[str, EventEnvelope]
    ) -> list[Outcome]:
        try:
            sent = await self.publisher.publish([envelopes[r.event_id] for r in rows])
        except Exception as exc:  # a publisher bug or outage: fail the call, never lose rows
            error = f"external publisher: {type(exc).__name__}: {exc}"
            log.warning("%s", error)
            return [Outcome(r, "failed", error) for r in rows]
        outcomes = []
        for row in rows:
            if row.event_id in sent.published:
                outcomes.append(Outcome(row, "published"))
            elif row.event_id in sent.unattempted:
                outcomes.append(Outcome(row, "unattempted"))
            else:
                error = sent.failed.get(row.event_id, "not confirmed by the external publisher")
                away = row.event_id in getattr(sent, "unavailable", ())  # an older publisher
                outcomes.append(Outcome(row, "failed", error, away=away))
        return outcomes
