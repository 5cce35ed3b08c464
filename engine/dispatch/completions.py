"""Writing a round's outcomes: group-committed as they arrive, each behind its claim's fence.

A write whose commit raised may have landed all the same (the server restarted
mid-COMMIT): such completions are *in doubt*, and are counted once the database says
which of them landed, so totals and metrics miss nothing.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Collection, Iterable, Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from engine.clock import Clock
from engine.dispatch import fenced_writes
from engine.dispatch.backoff import BackoffPolicy
from engine.dispatch.claimed import ClaimedRow, Outcome
from engine.dispatch.decoding import Decoder
from engine.dispatch.types import DispatchResult
from engine.handlers.idempotency import HandlerRunRecord, IdempotencyStore
from engine.storage.schema import DEAD_LETTER, FAILED, PUBLISHED
from engine.writing.registry import EventRegistry

log = logging.getLogger("engine.dispatcher")

# Completions in doubt kept for counting at once (a few rounds' worth; more go uncounted).
IN_DOUBT_LIMIT = 4000


class Unreported:
    """Counts that no round has returned yet: lost leases of hand-backs, completions in
    doubt that landed, the writes of a round that raised or finished behind."""

    def __init__(self) -> None:
        self._result = DispatchResult()

    def add(self, result: DispatchResult) -> None:
        self._result = self._result + result

    def take(self) -> DispatchResult:
        result, self._result = self._result, DispatchResult()
        return result


def successes_refused(outcomes: Sequence[Outcome], done: Collection[str]) -> list[HandlerRunRecord]:
    """Success records of the published outcomes whose completion the fence refused.

    The dispatcher that took the rows over delivers them again; with these it skips
    the handlers that already ran.
    """
    runs: list[HandlerRunRecord] = []
    for o in outcomes:
        if o.kind != "published" or o.row.event_id in done:
            continue
        runs.extend(HandlerRunRecord(o.row.event_id, h.key, True) for h in o.ran)
    return runs


class OutcomeWriter:
    """Writes one batch of outcomes in one transaction, each fenced by its claim."""

    def __init__(
        self,
        engine: AsyncEngine,
        dispatcher_id: str,
        *,
        registry: EventRegistry,
        decoder: Decoder,
        backoff: BackoffPolicy,
        idempotency: IdempotencyStore,
        clock: Clock,
    ) -> None:
        self.engine = engine
        self.dispatcher_id = dispatcher_id
        self.registry = registry
        self.decoder = decoder
        self.backoff = backoff
        self.idempotency = idempotency
        self.clock = clock

    async def write(self, outcomes: Sequence[Outcome]) -> DispatchResult:
        """Write ``outcomes``; what the fence refused counts as lost leases."""
        published = failed = dead = lost = 0
        wins: list[tuple[str, int]] = []
        untouched: list[tuple[str, int]] = []
        setbacks: list[Outcome] = []
        runs: list[HandlerRunRecord] = []
        for o in outcomes:
            if o.kind == "published":
                wins.append((o.row.event_id, o.row.claim_version))
            elif o.kind == "completed":
                published += 1
            elif o.kind == "lost":
                lost += 1
            elif o.kind == "unattempted":
                untouched.append((o.row.event_id, o.row.claim_version))
            else:
                setbacks.append(o)
                if o.runs:
                    runs.extend(o.runs)
        if not (wins or untouched or setbacks):  # all written by transactional handlers
            return DispatchResult(0, published, 0, 0, lost)
        budget = self.decoder.budget
        async with self.engine.begin() as conn:
            now = self.clock()
            fence = fenced_writes.Fence(self.dispatcher_id, now)
            done = await fenced_writes.mark_published(conn, wins, fence)
            published += len(done)
            if published < len(wins):
                lost += len(wins) - published
                runs.extend(successes_refused(outcomes, done))
            # Run records matter only for events that can be delivered again; a published
            # event is final (replay takes dead letters only), so its row is the record.
            await self.idempotency.record_handler_runs(conn, runs)
            released = await fenced_writes.release_unattempted(conn, untouched, fence)
            lost += len(untouched) - len(released)
            for o in setbacks:
                # An outage never takes the last attempt: that one is given back.
                refund = o.away and o.row.attempt_count >= budget(o.row)
                if o.kind == "failed" and (refund or o.row.attempt_count < budget(o.row)):
                    ok = await fenced_writes.mark_failed(
                        conn,
                        o.row.event_id,
                        o.row.claim_version,
                        fence,
                        error=o.error or "failed",
                        next_retry_at=now + self.backoff.delay(o.row.attempt_count),
                        refund_attempt=refund,
                    )
                    failed += ok
                else:
                    reason = o.reason or (
                        f"max attempts reached ({o.row.attempt_count}/{budget(o.row)}): {o.error}"
                    )
                    ok = await fenced_writes.mark_dead_letter(
                        conn,
                        o.row.event_id,
                        o.row.claim_version,
                        fence,
                        error=o.error or reason,
                        reason=reason,
                        release_key=self._releases_key(o.row),
                    )
                    dead += ok
                if not ok:
                    lost += 1
        return DispatchResult(0, published, failed, dead, lost)

    def _releases_key(self, row: ClaimedRow) -> bool:
        """Whether this row's dead letter lets the later events of its key go on."""
        if row.ordering_key is None:
            return False
        return self.registry.dead_letter_policy(row.event_type) == "skip"


class InDoubt:
    """Completions whose write raised, until the database says which of them landed."""

    def __init__(self, reader: AsyncEngine, unreported: Unreported) -> None:
        self._reader = reader
        self._unreported = unreported
        self.claims: dict[str, int] = {}

    def add(self, outcomes: Iterable[Outcome]) -> None:
        for o in outcomes:
            if o.kind != "unattempted" and len(self.claims) < IN_DOUBT_LIMIT:
                self.claims[o.row.event_id] = o.row.claim_version

    async def settle(self) -> None:
        """Count the completions in doubt that did commit; the ones that did not go back to
        the pool when their lease expires and are counted when next completed."""
        if not self.claims:
            return
        asked = list(self.claims.items())
        async with self._reader.connect() as conn:
            landed = await fenced_writes.completions_landed(conn, asked)
        # Only what was asked about: a round finishing behind may have added more meanwhile.
        for event_id, claim_version in asked:
            if self.claims.get(event_id) == claim_version:
                del self.claims[event_id]
        statuses = collections.Counter(landed.values())
        self._unreported.add(
            DispatchResult(
                published=statuses[PUBLISHED],
                failed=statuses[FAILED],
                dead_lettered=statuses[DEAD_LETTER],
            )
        )


class Completions:
    """Outcomes of one round, written in small batches while the rest is still running.

    One writer task drains what has arrived since its last write, so the batches grow
    with the arrival rate (group commit) and a crash loses only the outcomes of the
    write in progress. A storage error is kept and raised by ``close()``, after every
    handler of the round has finished; the rows it could not complete go back to the
    pool when their lease expires.
    """

    def __init__(
        self,
        claimed: int,
        *,
        writer: OutcomeWriter,
        in_doubt: InDoubt,
        dispatcher_id: str,
    ) -> None:
        self._writer_of_outcomes = writer
        self._in_doubt = in_doubt
        self._dispatcher_id = dispatcher_id
        self._outcomes: list[Outcome] = []
        self._arrived = asyncio.Event()
        self._closing = False
        self._error: BaseException | None = None
        self._first_problem: Outcome | None = None
        # Outcomes other than published (failed, dead letter, handed back): a round with
        # none is clean, so the batch claimed ahead is kept.
        self.setbacks = 0
        self.result = DispatchResult(claimed=claimed)
        self._writer: asyncio.Task[None] | None = None

    def add(self, outcome: Outcome) -> None:
        self._outcomes.append(outcome)
        if outcome.kind != "published" and outcome.kind != "completed":
            self.setbacks += 1
        if self._first_problem is None and outcome.kind in ("failed", "dead_letter"):
            self._first_problem = outcome
        self._arrived.set()
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop())

    def add_all(self, outcomes: Sequence[Outcome]) -> None:
        for outcome in outcomes:
            self.add(outcome)

    @property
    def write_failed(self) -> bool:
        """Whether the database refused one of this round's writes."""
        return self._error is not None

    async def close(self) -> None:
        """Write what is left; raise the first storage error of the round, if any."""
        self._closing = True
        self._arrived.set()
        if self._writer is not None:
            await self._writer
        self._log(self.result)
        if self._error is not None:
            raise self._error

    async def _write_loop(self) -> None:
        while True:
            await self._arrived.wait()
            await asyncio.sleep(0)  # let outcomes that are ready now join this write
            self._arrived.clear()
            outcomes, self._outcomes = self._outcomes, []
            if outcomes:
                await self._write(outcomes)
            if self._closing and not self._outcomes:
                return

    async def _write(self, outcomes: list[Outcome]) -> None:
        if self._error is not None:
            return  # the database refused a write this round: leave the rest to the lease
        try:
            written = await self._writer_of_outcomes.write(outcomes)
        except Exception as exc:
            self._error = exc
            self._in_doubt.add(outcomes)
            return
        self.result = self.result + written

    def _log(self, result: DispatchResult) -> None:
        """One line per round, not per event: a handler outage must not flood the log."""
        if result.lost_leases:
            log.warning(
                "dispatcher %s lost the lease on %d event(s)",
                self._dispatcher_id,
                result.lost_leases,
            )
        first = self._first_problem
        if first is not None and (result.failed or result.dead_lettered):
            log.warning(
                "dispatcher %s: %d failed (retrying), %d dead-lettered of %d claimed; "
                "first: event %s: %s",
                self._dispatcher_id,
                result.failed,
                result.dead_lettered,
                result.claimed,
                first.row.event_id,
                first.error,
            )
