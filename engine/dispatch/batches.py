"""Claiming decoded batches in a transaction of their own, and handing unstarted ones back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from engine.clock import Clock
from engine.dispatch import fenced_writes
from engine.dispatch.claimed import Batch
from engine.dispatch.claimer import Claimer, ClaimScope
from engine.dispatch.completions import Unreported
from engine.dispatch.decoding import Decoder
from engine.dispatch.types import DispatchResult
from engine.operating import pauses

log = logging.getLogger("engine.dispatcher")


class Batches:
    """Where a dispatcher's batches come from and go back to.

    ``served_types()`` are the event types it can deliver; operators' pauses are read in
    the claim's own transaction, so every dispatcher obeys a pause from its next claim on.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        claim_engine: AsyncEngine,
        reader: AsyncEngine,
        claimer: Claimer,
        decoder: Decoder,
        *,
        served_types: Callable[[], list[str]],
        clock: Clock,
        unreported: Unreported,
    ) -> None:
        self.engine = engine
        self._claim_engine = claim_engine
        self._reader = reader
        self.claimer = claimer
        self.decoder = decoder
        self._served_types = served_types
        self.clock = clock
        self._unreported = unreported

    async def scope(self, conn: AsyncConnection) -> ClaimScope:
        """What may be claimed now: the served types, less what operators paused."""
        paused = pauses.claim_filter(await pauses.active_pauses(conn))
        return ClaimScope(frozenset(self._served_types()) - paused.event_types, paused.pairs)

    async def claim(self) -> Batch:
        """Claim a batch in one transaction and decode it (undeliverable rows set apart).

        Its rows are decoded while the claim's commit is on its way, and the batch is
        returned (so its handlers start) only once the commit is done: until then another
        dispatcher may take the rows (decision 0021).
        """
        claimed_at = self.clock()
        async with self._claim_engine.connect() as conn:
            await conn.begin()
            claimed = await self.claimer.claim(conn, claimed_at, await self.scope(conn))
            batch = Batch(claimed_at, claimed.rows)
            committing = asyncio.ensure_future(conn.commit())
            try:
                await asyncio.sleep(0)  # the commit is sent before decoding holds the loop
                self.decoder.decode_into(batch)
            finally:
                # Shielded: a cancellation meanwhile must not cut the commit short while the
                # connection closes under it; the commit's own error, if any, is raised.
                await asyncio.shield(committing)
        self.claimer.committed(claimed)
        return batch

    async def without_paused(self, held: Batch) -> Batch | None:
        """A batch claimed ahead, less rows of types paused since; those go back unattempted.

        So a pause holds every dispatcher from its next round on, also for a batch claimed
        before the pause. None when nothing is left to deliver.
        """
        async with self._reader.connect() as conn:
            scope = await self.scope(conn)
        paused = [r for r in held.rows if not scope.admits(r.event_type, r.tenant_id)]
        if not paused:
            return held
        await self.release(Batch(held.claimed_at, paused))
        kept = held.without({r.event_id for r in paused})
        return kept if kept.rows else None

    async def release(self, batch: Batch | None) -> None:
        """Hand a batch that was claimed but never started back, spending no attempt.

        Rows it no longer held (their lease expired and another dispatcher took them
        over) are lost leases, reported with the next round.
        """
        if batch is None or not batch.rows:
            return
        claims = [(r.event_id, r.claim_version) for r in batch.rows]
        fence = fenced_writes.Fence(self.claimer.dispatcher_id, self.clock())
        async with self.engine.begin() as conn:
            released = await fenced_writes.release_unattempted(conn, claims, fence)
        lost = len(claims) - len(released)
        if lost:
            log.warning(
                "dispatcher %s lost the lease on %d event(s) claimed ahead",
                self.claimer.dispatcher_id,
                lost,
            )
            self._unreported.add(DispatchResult(lost_leases=lost))

    async def release_or_warn(self, batch: Batch | None) -> None:
        """Hand back a batch claimed ahead; a failure is logged, not raised: the round's
        own outcome (or error) matters more, and the rows' lease expires."""
        try:
            await self.release(batch)
        except Exception as exc:
            log.warning(
                "dispatcher %s could not hand back %d event(s) claimed ahead: %s",
                self.claimer.dispatcher_id,
                len(batch.rows) if batch is not None else 0,
                type(exc).__name__,
            )
