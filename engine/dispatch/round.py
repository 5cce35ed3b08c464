"""One round: deliver a claimed batch, write its outcomes, and claim the next one ahead.

With ``prefetch`` (the run loop's), a round with a full batch claims the next one while
its handlers run (PostgreSQL) or its relay's confirms are outstanding, and keeps it for
the next round only if every event was published; otherwise, and on stop, it goes back
unattempted. With ``overlap_rounds`` (the run loop's too), a round whose events have all
started, clean so far, hands off once that batch is claimed: the next round starts
beside its last calls, which finish behind it within the same ``max_concurrency``, so
one slow handler holds a slot, not the dispatcher (decisions 0018 and 0019).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from engine.clock import Clock
from engine.dispatch.batches import Batches
from engine.dispatch.claimed import Batch, Outcome
from engine.dispatch.completions import Completions, Unreported
from engine.dispatch.delivery import LocalDelivery, Workers
from engine.dispatch.relaying import Relaying
from engine.dispatch.types import DispatchResult

log = logging.getLogger("engine.dispatcher")


@dataclass(frozen=True, slots=True)
class RoundLimits:
    """What bounds a round: ``start_budget`` is how long after its claim an event may still
    start; ``prefetch`` and ``overlap_rounds`` are described in the module docstring."""

    batch_size: int
    max_concurrency: int
    start_budget: timedelta
    prefetch: bool
    overlap_rounds: bool


class RoundsBehind:
    """Rounds that handed off: their last handlers finish behind the next round."""

    def __init__(self) -> None:
        self._entries: list[tuple[asyncio.Task[None], Workers]] = []
        self.error: Exception | None = None  # the first error of a round behind

    def add(self, task: asyncio.Task[None], workers: Workers) -> None:
        self._entries.append((task, workers))

    def calls(self) -> int:
        """Handler calls in flight in the rounds finishing behind."""
        return sum(workers.in_calls for _task, workers in self._entries)

    def all_done(self) -> bool:
        return all(task.done() for task, _workers in self._entries)

    async def join(self, *, wait: bool) -> None:
        """Collect the rounds finished behind (with ``wait``, every one, once it ends);
        keep the first error for the next round to raise."""
        for entry in list(self._entries):
            task, _workers = entry
            if not (wait or task.done()):
                continue
            self._entries.remove(entry)
            try:
                await task
            except asyncio.CancelledError:
                # Cancelled while waiting: none of the rounds behind may outlive this one.
                for other, _ in self._entries:
                    other.cancel()
                await asyncio.gather(*(t for t, _ in self._entries), return_exceptions=True)
                self._entries.clear()
                raise
            except Exception as exc:
                if self.error is None:
                    self.error = exc


class Rounds:
    """Runs rounds one after another, holding the batch claimed ahead between them.

    Events go to ``local`` handlers, or to ``relaying`` when the dispatcher relays.
    """

    def __init__(
        self,
        batches: Batches,
        *,
        local: LocalDelivery | None,
        relaying: Relaying | None,
        new_completions: Callable[[int], Completions],
        behind: RoundsBehind,
        unreported: Unreported,
        limits: RoundLimits,
        clock: Clock,
    ) -> None:
        self.batches = batches
        self.local = local
        self.relaying = relaying
        self._new_completions = new_completions
        self.behind = behind
        self._unreported = unreported
        self.limits = limits
        self.clock = clock
        self.held: Batch | None = None  # the batch claimed ahead, for the next round

    async def run(self, stop: asyncio.Event | None) -> DispatchResult:
        """One round: what it wrote (a round that hands off reports the rest later)."""
        await self.behind.join(wait=False)
        if self.behind.error is not None:  # the round behind could not write its outcomes
            error, self.behind.error = self.behind.error, None
            held, self.held = self.held, None
            await self.batches.release_or_warn(held)  # not held through the loop's back-off
            raise error
        held, self.held = self.held, None
        if self.relaying is not None and not await self.relaying.ready():
            await self.batches.release(held)
            return DispatchResult()  # the broker is away: claim nothing, spend nothing
        stopping = stop is not None and stop.is_set()
        start_by = None if held is None else held.claimed_at + self.limits.start_budget
        if held is not None and (stopping or (start_by is not None and self.clock() >= start_by)):
            await self.batches.release(held)  # stopping, or held too long to start it safely
            held = None
        if held is not None:
            held = await self.batches.without_paused(held)
        batch = held if held is not None else await self.batches.claim()
        if not batch.rows:
            return DispatchResult()
        completions = self._new_completions(len(batch.rows))
        completions.add_all(batch.undeliverable)
        stopping = stop is not None and stop.is_set()
        try:
            handed_off = await self._deliver_and_record(batch, completions, stop, stopping)
        except BaseException:
            # Writes that succeeded before the error happened all the same: the next
            # report carries them (a storage error ends this round, not the count).
            self._unreported.add(completions.result)
            raise
        if handed_off:  # what it writes from now on is reported by a later round
            result, completions.result = completions.result, DispatchResult()
            return result
        return completions.result

    async def _deliver_and_record(
        self,
        batch: Batch,
        completions: Completions,
        stop: asyncio.Event | None,
        stopping: bool,
    ) -> bool:
        """Deliver (or relay) the batch while claiming the next one ahead, if worth it, and
        write the outcomes; keep or hand back the batch claimed ahead.

        True: the round handed off (``overlap_rounds``): every event has started, the
        batch claimed ahead is kept for the next round, and the handlers still running
        finish behind it, their outcomes written as they end.
        """
        deliverable = batch.deliverable()
        upcoming: asyncio.Task[Batch] | None = None
        worth_it = self.limits.prefetch and self._worth_claiming_ahead(batch)
        progress = asyncio.Event()  # wakes the workers' wait to hand off

        def claim_ahead() -> None:
            nonlocal upcoming, worth_it
            if worth_it and not (stop is not None and stop.is_set()):  # not once stopping
                upcoming = asyncio.create_task(self.batches.claim())
                upcoming.add_done_callback(lambda _task: progress.set())
            worth_it = False  # once a round

        def may_hand_off(in_calls: int) -> bool:
            """Every event started: may the next round start beside the calls in flight?"""
            return (
                upcoming is not None
                and upcoming.done()
                and not upcoming.cancelled()
                and upcoming.exception() is None
                and bool(upcoming.result().rows)
                and completions.setbacks == len(batch.undeliverable)  # clean so far
                and not completions.write_failed
                and not (stop is not None and stop.is_set())
                # the next round's first call fits beside every call still in flight
                and in_calls + self.behind.calls() < self.limits.max_concurrency
            )

        handed_off = False
        try:
            if self.relaying is not None:
                if stopping:
                    completions.add_all([Outcome(r, "unattempted") for r in deliverable])
                else:
                    claim_ahead()  # while the confirms are outstanding
                    completions.add_all(await self.relaying.relay(deliverable, batch.envelopes))
            else:
                assert self.local is not None
                behind = await self.local.deliver(
                    deliverable,
                    batch.envelopes,
                    deadline=batch.claimed_at + self.limits.start_budget,
                    stop=stop,
                    outcomes=completions,
                    on_waiting=claim_ahead,
                    hand_off=may_hand_off if self.limits.overlap_rounds else None,
                    progress=progress,
                )
                if behind is not None:
                    assert upcoming is not None  # may_hand_off saw it claimed
                    self.held = upcoming.result()
                    finishing = asyncio.create_task(self._finish_behind(behind, completions))
                    self.behind.add(finishing, behind)
                    handed_off = True
        finally:
            if not handed_off:
                await self._close_round(batch, completions, upcoming, stop)
        return handed_off

    async def _close_round(
        self,
        batch: Batch,
        completions: Completions,
        upcoming: asyncio.Task[Batch] | None,
        stop: asyncio.Event | None,
    ) -> None:
        """Write the round's last outcomes; keep the batch claimed ahead only after a clean
        round (every event published) that is not stopping, else hand it back."""
        clean = completions.setbacks == len(batch.undeliverable)
        closing = asyncio.ensure_future(completions.close())
        try:
            if upcoming is not None and clean:
                await self._prepare(upcoming)  # while this round's completion commits
        finally:
            written = False
            try:
                await closing
                written = True
            finally:
                if upcoming is not None:
                    stopping = stop is not None and stop.is_set()
                    keep = written and clean and not stopping
                    await self._keep_or_release(upcoming, keep=keep)

    async def _finish_behind(self, workers: Workers, completions: Completions) -> None:
        """The last handlers of a round that handed off: await them, write their outcomes."""
        try:
            await workers.finish()
        finally:
            try:
                await completions.close()
            finally:
                self._unreported.add(completions.result)

    def _worth_claiming_ahead(self, batch: Batch) -> bool:
        """Whether to claim the next batch while this one is delivered.

        A full batch says more rows are waiting. Local delivery claims ahead only once its
        handlers wait (two are mid-call at once): quick handlers keep the CPU busy anyway.
        Not when every row is the head of an ordering key: those keys are in flight until
        this round ends, so a claim now would walk keys it cannot take.
        """
        if len(batch.rows) < self.limits.batch_size:
            return False
        return any(row.ordering_key is None for row in batch.rows)

    async def _prepare(self, upcoming: asyncio.Task[Batch]) -> None:
        """Let the relay build the next batch's messages while the completion commits."""
        if self.relaying is None or not self.relaying.prepares:
            return
        try:
            batch = await upcoming
        except Exception:
            return  # _keep_or_release reports it
        await self.relaying.prepare([batch.envelopes[r.event_id] for r in batch.deliverable()])

    async def _keep_or_release(self, upcoming: asyncio.Task[Batch], keep: bool) -> None:
        """Keep the batch claimed ahead for the next round, or hand it back at once.

        It is kept only after a round whose every event was published: after a failure
        or an outage the next round may not come soon (idle wait, open circuit), and
        rows held meanwhile would wait for their lease or spend an attempt.
        """
        try:
            batch = await upcoming
        except Exception as exc:  # the next round claims again; nothing was taken
            log.debug("claiming the next batch ahead failed: %s", type(exc).__name__)
            return
        if keep and batch.rows:
            self.held = batch
            return
        await self.batches.release_or_warn(batch)
