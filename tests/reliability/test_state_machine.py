"""The outbox's state machine, explored by hypothesis against a real database (issue 9).

Random sequences of claims by two dispatchers driven through ``engine.dispatch.store`` (so their
completions can arrive late: after their lease expired, or after a newer claim took the
row), rounds of the real ``OutboxDispatcher``, producers adding events, lease expiry on an
injected clock, and operators' replay and skip. A model predicts every row's state; after
every step the database must equal the model and satisfy the invariants below
(``OutboxMachine.outbox_invariants``).

- every status is one of ``STATUSES``; a row is leased (locked_by and locked_until) exactly
  while it is publishing; published rows have ``published_at``, dead letters a reason, and
  only dead letters with an ordering key are skipped;
- ``claim_version`` only grows, and ``attempt_count`` never exceeds it;
- the attempt budget: a pending or failed row has attempts left, a published one never
  spent more than ``max_attempts``, and no handler ever runs past the budget (beyond it
  only expired leases count, and the dispatcher dead-letters without running anything);
- a claim takes exactly what is due (one expired lease alone, else due unordered rows and
  the heads of keys with nothing in flight, within the claim scope);
- at most one event per ordering key is in flight, and never while an earlier event of
  its key is unfinished unless that one was skipped;
- a completion (published, failed, dead letter, release) holds only for the dispatcher
  whose lease is current (holder, claim_version, expiry): a late one is refused and
  changes nothing; no completion holds twice;
- replay takes dead letters only, skip only dead letters that hold a key;
- nothing is lost: the rows are exactly the ones produced.

CI runs a fixed set of examples (derandomized) per database; ``--soak`` runs many more,
randomly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import select, text

from engine import (
    BackoffPolicy,
    DispatchResult,
    EventHandlerPermanentError,
    EventRegistry,
    OutboxDispatcher,
    OutboxEventPublisher,
    create_engine,
    create_schema,
    unit_of_work,
)
from engine.dispatch import fenced_writes
from engine.dispatch.claimer import ClaimCursor, ClaimedBatch, Claimer, ClaimScope
from engine.operating.replay import replay_dead_letter, skip_dead_letter
from engine.storage.schema import (
    DEAD_LETTER,
    FAILED,
    PENDING,
    PUBLISHED,
    PUBLISHING,
    STATUSES,
    outbox_events,
)
from engine.writing.publisher import OutboxEvent
from tests.conftest import FakeClock
from tests.engine.conftest import CTX
from tests.reliability.results import ScenarioResult, record

T = TypeVar("T")
LEASE = timedelta(seconds=10)
RETRY = timedelta(seconds=3)  # the real dispatcher's fixed backoff
BLOCKING = "sm.blocking"  # ordered by aggregate; a dead letter holds its key
SKIPPING = "sm.skipping"  # ordered by aggregate; a dead letter releases its key
FREE = "sm.free"  # unordered
TYPES = (BLOCKING, SKIPPING, FREE)
AGGREGATES = ("a", "b", "c")
HARNESS = ("d1", "d2")  # dispatchers made of store calls: their completions may be late
REAL = "d3"  # the real OutboxDispatcher
MAX_ROWS = 12
SOAK_EXAMPLES = 250  # x 60 steps: minutes per database, against 25 x 30 in CI
FATES = ("ok", "transient", "permanent")
ACTIVE = (PENDING, PUBLISHING, FAILED)


@dataclass
class ModelRow:
    """What the model expects of one outbox row."""

    id: str
    index: int  # creation order, for the real dispatcher's fates
    event_type: str
    ordering_key: str | None
    max_attempts: int
    seq: int
    status: str = PENDING
    attempt_count: int = 0
    claim_version: int = 0
    locked_by: str | None = None
    locked_until: datetime | None = None
    next_retry_at: datetime | None = None
    published_at: datetime | None = None
    skipped_at: datetime | None = None
    replay_count: int = 0
    last_replayed_at: datetime | None = None

    def unfinished(self) -> bool:
        """Holds back the later events of its key (KEY_UNFINISHED_PREDICATE)."""
        return self.status in ACTIVE or (self.status == DEAD_LETTER and self.skipped_at is None)

    def due(self, now: datetime) -> bool:
        return (
            self.status in (PENDING, FAILED)
            and (self.next_retry_at is None or self.next_retry_at <= now)
            and (self.locked_until is None or self.locked_until < now)
        )

    def compared(self) -> tuple[Any, ...]:
        return (
            self.status,
            self.attempt_count,
            self.claim_version,
            self.locked_by,
            self.locked_until,
            self.next_retry_at,
            self.published_at,
            self.skipped_at,
            self.replay_count,
            self.last_replayed_at,
            self.ordering_key,
            self.max_attempts,
        )


@dataclass(frozen=True)
class Claim:
    """A claim a harness dispatcher holds (or held): its token and what it saw."""

    dispatcher: str
    event_id: str
    claim_version: int
    attempt_count: int
    max_attempts: int
    ordering_key: str | None
    event_type: str

    @property
    def over_budget(self) -> bool:
        """Claimed past its budget after an expired lease: the only outcome is a dead letter."""
        return self.attempt_count > self.max_attempts


@dataclass
class Stats:
    """What every example of one test did, for the scenario record."""

    examples: int = 0
    events: int = 0
    steps: int = 0
    completions: int = 0
    refused: int = 0
    refused_expired: int = 0
    refused_superseded: int = 0
    refused_finished: int = 0
    real_rounds: int = 0
    replays: int = 0
    skips: int = 0
    abandoned_reclaims: int = 0
    dead_letters: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


COLUMNS = (
    "status",
    "attempt_count",
    "claim_version",
    "locked_by",
    "locked_until",
    "next_retry_at",
    "published_at",
    "skipped_at",
    "replay_count",
    "last_replayed_at",
    "ordering_key",
    "max_attempts",
)
SNAPSHOT = select(
    outbox_events.c.id,
    outbox_events.c.seq,
    outbox_events.c.dead_letter_reason,
    *(outbox_events.c[name] for name in COLUMNS),
)
CLEAR = ("outbox_replay_log", "outbox_handler_runs", "outbox_side_effects", "outbox_events")


def make_registry(handle: Any) -> EventRegistry:
    registry = EventRegistry()
    for event_type in TYPES:
        registry.register_event(event_type, 1)
        registry.register_handler(event_type, handle, key="sm.handle")
    registry.set_ordering(BLOCKING)
    registry.set_ordering(SKIPPING, on_dead_letter="skip")
    return registry


class OutboxMachine(RuleBasedStateMachine):
    """One example: a fresh set of rows in the test's database, a model, a clock."""

    def __init__(self, url: str, stats: Stats) -> None:
        super().__init__()
        self.stats = stats
        stats.examples += 1
        self.loop = asyncio.new_event_loop()
        self.engine = create_engine(url)
        self.clock = FakeClock()
        self.model: dict[str, ModelRow] = {}
        self.produced: list[str] = []
        self.seen_versions: dict[str, int] = {}
        self.cursors = dict.fromkeys(HARNESS, "")
        self.claims: list[Claim] = []  # every harness claim, completed or not
        self.fates: list[str] = ["ok"] * MAX_ROWS
        self.over_budget_runs: list[str] = []
        self.registry = make_registry(self._handle)
        self.real = OutboxDispatcher(
            self.engine,
            self.registry,
            dispatcher_id=REAL,
            batch_size=100,
            lease_seconds=LEASE.total_seconds(),
            backoff=BackoffPolicy(kind="fixed", base_seconds=RETRY.total_seconds(), jitter=0),
            clock=self.clock,
        )
        self.run(self._clear())

    # -- plumbing -----------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            self.run(self.engine.dispose())
        finally:
            self.loop.close()

    async def _clear(self) -> None:
        """Empty the tables. On PostgreSQL by TRUNCATE, so that every example starts from
        empty files: a reclaim takes one of the rows whose leases ended at the same instant,
        the first in the lease index, and PostgreSQL orders such ties by where the rows lie
        in the heap. Left from earlier examples (DELETE), that layout differed for the same
        steps, so did the reclaimed row and the rules enabled after it, and hypothesis
        stopped the run (FlakyStrategyDefinition). SQLite orders ties by rowid."""
        async with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                await conn.execute(text(f"TRUNCATE {', '.join(CLEAR)}"))
                return
            for table in CLEAR:
                await conn.execute(text(f"DELETE FROM {table}"))

    async def _snapshot(self) -> dict[str, dict[str, Any]]:
        async with self.engine.connect() as conn:
            return {r["id"]: dict(r) for r in (await conn.execute(SNAPSHOT)).mappings()}

    async def _handle(self, envelope: Any) -> None:
        if envelope.attempt_count > envelope.max_attempts:
            self.over_budget_runs.append(envelope.event_id)
        row = self.model[envelope.event_id]
        fate = self.fates[row.index]
        if fate == "transient":
            raise ConnectionError("vendor down")
        if fate == "permanent":
            raise EventHandlerPermanentError("vendor refused it")

    def _now(self) -> datetime:
        return self.clock()

    # -- the model's view of a claim ----------------------------------------------------

    def _in_flight_keys(self) -> set[str]:
        return {
            r.ordering_key
            for r in self.model.values()
            if r.ordering_key is not None and r.locked_by is not None
        }

    def _abandoned(self, types: frozenset[str]) -> list[ModelRow]:
        now = self._now()
        return [
            r
            for r in self.model.values()
            if r.locked_by is not None
            and r.locked_until is not None
            and r.locked_until < now
            and r.event_type in types
        ]

    def _eligible(self, types: frozenset[str]) -> tuple[set[str], bool]:
        """What a claim within ``types`` may take now, and whether it is one expired lease."""
        abandoned = self._abandoned(types)
        if abandoned:
            first = min(r.locked_until for r in abandoned if r.locked_until is not None)
            return {r.id for r in abandoned if r.locked_until == first}, True
        now = self._now()
        eligible = {
            r.id
            for r in self.model.values()
            if r.ordering_key is None and r.due(now) and r.event_type in types
        }
        in_flight = self._in_flight_keys()
        for key in {r.ordering_key for r in self.model.values() if r.ordering_key is not None}:
            unfinished = [
                r for r in self.model.values() if r.ordering_key == key and r.unfinished()
            ]
            if not unfinished or key in in_flight:
                continue
            head = min(unfinished, key=lambda r: r.seq)
            if head.due(now) and head.event_type in types:
                eligible.add(head.id)
        return eligible, False

    def _check_order(self, row: ModelRow) -> None:
        """Every earlier event of ``row``'s key is finished: published, or a skipped dead letter."""
        if row.ordering_key is None:
            return
        for other in self.model.values():
            if other.ordering_key == row.ordering_key and other.seq < row.seq:
                assert not other.unfinished(), (
                    f"{row.id} of key {row.ordering_key} claimed while the earlier {other.id} "
                    f"is {other.status}"
                )

    def _apply_claim(self, event_id: str, dispatcher: str) -> ModelRow:
        row = self.model[event_id]
        self._check_order(row)
        row.status = PUBLISHING
        row.locked_by = dispatcher
        row.locked_until = self._now() + LEASE
        row.claim_version += 1
        row.attempt_count += 1
        return row

    def _held(self, claim: Claim) -> str | None:
        """None if ``claim``'s lease is current now; else why a completion must be refused."""
        row = self.model[claim.event_id]
        if row.claim_version != claim.claim_version:
            return "superseded"
        if row.status != PUBLISHING or row.locked_by != claim.dispatcher:
            return "finished"
        assert row.locked_until is not None
        if row.locked_until <= self._now():
            return "expired"
        return None

    def _release_key(self, event_type: str, ordering_key: str | None) -> bool:
        return ordering_key is not None and event_type == SKIPPING

    def _finish(self, row: ModelRow, status: str, *, retry_at: datetime | None = None) -> None:
        row.status = status
        row.locked_by = None
        row.locked_until = None
        if status == PUBLISHED:
            row.published_at = self._now()
            row.next_retry_at = None
        elif status == FAILED:
            row.next_retry_at = retry_at
        elif status == DEAD_LETTER:
            row.next_retry_at = None
            row.skipped_at = (
                self._now() if self._release_key(row.event_type, row.ordering_key) else None
            )
            self.stats.dead_letters += 1

    # -- rules: producers ---------------------------------------------------------------

    async def _produce(self, drafts: list[tuple[str, str, int]]) -> list[str]:
        events = [
            OutboxEvent(
                event_type, {"n": len(self.produced) + i}, "order", agg, max_attempts=budget
            )
            for i, (event_type, agg, budget) in enumerate(drafts)
        ]
        async with unit_of_work(self.engine, registry=self.registry, context=CTX) as session:
            ids = await OutboxEventPublisher(session, clock=self.clock).publish_many(events)
        async with self.engine.connect() as conn:
            stmt = select(outbox_events.c.id, outbox_events.c.seq, outbox_events.c.ordering_key)
            stored = {r.id: r for r in await conn.execute(stmt.where(outbox_events.c.id.in_(ids)))}
        for event_id, (event_type, agg, budget) in zip(ids, drafts, strict=True):
            expected_key = None if event_type == FREE else f"order:{agg}"
            assert stored[event_id].ordering_key == expected_key
            assert all(stored[event_id].seq > r.seq for r in self.model.values())
            self.model[event_id] = ModelRow(
                event_id,
                len(self.produced),
                event_type,
                expected_key,
                budget,
                stored[event_id].seq,
            )
            self.produced.append(event_id)
        self.stats.events += len(ids)
        return ids

    drafts = st.tuples(st.sampled_from(TYPES), st.sampled_from(AGGREGATES), st.integers(1, 3))

    @initialize(first=st.lists(drafts, min_size=2, max_size=6))
    def produce_first(self, first: list[tuple[str, str, int]]) -> None:
        self.run(self._produce(first))

    @precondition(lambda self: len(self.model) < MAX_ROWS)
    @rule(draft=drafts)
    def produce(self, draft: tuple[str, str, int]) -> None:
        self.run(self._produce([draft]))

    # -- rules: harness dispatchers (store calls) ---------------------------------------

    @rule(
        dispatcher=st.sampled_from(HARNESS),
        batch=st.integers(1, 6),
        ordered_first=st.booleans(),
        served=st.one_of(st.none(), st.sets(st.sampled_from(TYPES), min_size=1)),
    )
    def claim(
        self, dispatcher: str, batch: int, ordered_first: bool, served: set[str] | None
    ) -> None:
        types = frozenset(served) if served is not None else frozenset(TYPES)
        scope = None if served is None else ClaimScope(types)
        eligible, abandoned = self._eligible(types)
        cursor = self.cursors[dispatcher]

        async def claim() -> ClaimedBatch:
            async with self.engine.begin() as conn:
                return await Claimer(
                    dispatcher,
                    batch,
                    LEASE,
                    cursor=ClaimCursor(key=cursor, ordered_first=ordered_first),
                ).claim(conn, self._now(), scope)

        result = self.run(claim())
        self.cursors[dispatcher] = result.cursor.key
        ids = [r.event_id for r in result.rows]
        assert len(ids) == len(set(ids))
        assert set(ids) <= eligible, f"claimed {set(ids) - eligible} that were not due"
        assert bool(ids) == bool(eligible), f"claimed {ids} of eligible {eligible}"
        if abandoned:
            assert len(ids) == 1, "an expired lease is reclaimed alone"
            self.stats.abandoned_reclaims += 1
        elif not cursor:
            assert len(ids) == min(batch, len(eligible))
        assert len(ids) <= batch
        assert len({r.ordering_key for r in result.rows if r.ordering_key}) == len(
            [r for r in result.rows if r.ordering_key]
        ), "two events of one key in one claim"
        for claimed in result.rows:
            row = self._apply_claim(claimed.event_id, dispatcher)
            assert (claimed.claim_version, claimed.attempt_count) == (
                row.claim_version,
                row.attempt_count,
            )
            self.claims.append(
                Claim(
                    dispatcher,
                    row.id,
                    row.claim_version,
                    row.attempt_count,
                    row.max_attempts,
                    row.ordering_key,
                    row.event_type,
                )
            )

    def _pick_claim(self, index: int, live: bool) -> Claim:
        """A claim by index: among those whose row is still in their hands (if any), or any.

        A live claim may still hold its lease or have let it expire; any other is late.
        """
        held = [
            c
            for c in self.claims
            if self.model[c.event_id].claim_version == c.claim_version
            and self.model[c.event_id].status == PUBLISHING
        ]
        pool = held if live and held else self.claims
        return pool[index % len(pool)]

    def _complete(self, claim: Claim, kind: str, delay: int = 0) -> None:
        """One fenced completion, as the dispatcher's policy writes it (see _complete there)."""
        if claim.over_budget:
            kind = "dead_letter"  # past its budget: the dispatcher only dead-letters it
        elif kind == "failed" and claim.attempt_count >= claim.max_attempts:
            kind = "dead_letter"  # the last attempt failed: max attempts reached
        why = self._held(claim)
        before = self.run(self._snapshot())
        now = self._now()
        fence = fenced_writes.Fence(claim.dispatcher, now)
        token = (claim.event_id, claim.claim_version)

        async def write() -> bool:
            async with self.engine.begin() as conn:
                if kind == "published":
                    return bool(await fenced_writes.mark_published(conn, [token], fence))
                if kind == "release":
                    return bool(await fenced_writes.release_unattempted(conn, [token], fence))
                if kind == "failed":
                    return await fenced_writes.mark_failed(
                        conn,
                        *token,
                        fence,
                        error="boom",
                        next_retry_at=now + timedelta(seconds=delay),
                    )
                return await fenced_writes.mark_dead_letter(
                    conn,
                    *token,
                    fence,
                    error="gone",
                    reason=f"permanent: gone (attempt {claim.attempt_count})",
                    release_key=self._release_key(claim.event_type, claim.ordering_key),
                )

        held = self.run(write())
        self.stats.completions += 1
        if why is not None:
            assert not held, f"a {why} completion ({kind}) of {claim} was accepted"
            assert self.run(self._snapshot()) == before, "a refused completion changed rows"
            self.stats.refused += 1
            setattr(self.stats, f"refused_{why}", getattr(self.stats, f"refused_{why}") + 1)
            return
        assert held, f"the current lease's completion ({kind}) of {claim} was refused"
        row = self.model[claim.event_id]
        if kind == "published":
            self._finish(row, PUBLISHED)
        elif kind == "failed":
            self._finish(row, FAILED, retry_at=now + timedelta(seconds=delay))
        elif kind == "dead_letter":
            self._finish(row, DEAD_LETTER)
        else:  # handed back unattempted: the attempt is refunded, next_retry_at stays
            retry_at = row.next_retry_at
            self._finish(row, PENDING if row.attempt_count <= 1 else FAILED, retry_at=retry_at)
            row.attempt_count = max(row.attempt_count - 1, 0)

    has_claims = precondition(lambda self: bool(self.claims))
    picks: ClassVar = {"index": st.integers(0, 63), "live": st.booleans()}

    @has_claims
    @rule(**picks)
    def complete(self, index: int, live: bool) -> None:
        self._complete(self._pick_claim(index, live), "published")

    @has_claims
    @rule(**picks, delay=st.sampled_from([0, 2, 30]))
    def fail(self, index: int, live: bool, delay: int) -> None:
        self._complete(self._pick_claim(index, live), "failed", delay)

    @has_claims
    @rule(**picks)
    def dead_letter(self, index: int, live: bool) -> None:
        self._complete(self._pick_claim(index, live), "dead_letter")

    @has_claims
    @rule(**picks)
    def release(self, index: int, live: bool) -> None:
        self._complete(self._pick_claim(index, live), "release")

    # -- rules: the real dispatcher -----------------------------------------------------

    @precondition(lambda self: bool(self._eligible(frozenset(TYPES))[0]))
    @rule(fates=st.lists(st.sampled_from(FATES), min_size=MAX_ROWS, max_size=MAX_ROWS))
    def dispatch_round(self, fates: list[str]) -> None:
        """One real round: it claims exactly what is due (batch 100 > rows) at one instant."""
        self.fates = fates
        eligible, abandoned = self._eligible(frozenset(TYPES))
        before = self.run(self._snapshot())
        result = self.run(self.real.dispatch_once())
        after = self.run(self._snapshot())
        changed = {i for i in after if after[i]["claim_version"] != before[i]["claim_version"]}
        assert changed <= eligible, f"the dispatcher claimed {changed - eligible}, not due"
        if abandoned:
            assert len(changed) == 1
            self.stats.abandoned_reclaims += 1
        else:
            assert changed == eligible
        assert not self.over_budget_runs, f"handlers ran past the budget: {self.over_budget_runs}"
        published = failed = dead = 0
        for event_id in sorted(changed, key=lambda i: self.model[i].seq):
            row = self._apply_claim(event_id, REAL)
            fate = self.fates[row.index]
            if row.attempt_count > row.max_attempts or fate == "permanent":
                self._finish(row, DEAD_LETTER)
                dead += 1
            elif fate == "ok":
                self._finish(row, PUBLISHED)
                published += 1
            elif row.attempt_count < row.max_attempts:
                self._finish(row, FAILED, retry_at=self._now() + RETRY)
                failed += 1
            else:
                self._finish(row, DEAD_LETTER)
                dead += 1
            if row.status == DEAD_LETTER:
                reason = after[event_id]["dead_letter_reason"]
                if row.attempt_count > row.max_attempts:
                    assert reason.startswith("attempts exhausted"), reason
                elif fate == "permanent":
                    assert reason.startswith("permanent: "), reason
                else:
                    assert reason.startswith("max attempts reached"), reason
        assert result == DispatchResult(len(changed), published, failed, dead, 0)
        self.stats.real_rounds += 1

    # -- rules: time and operators ------------------------------------------------------

    @rule(seconds=st.sampled_from([1, 3, 9]))
    def tick(self, seconds: int) -> None:
        self.clock.advance(seconds)

    def _leases(self) -> list[datetime]:
        return sorted({r.locked_until for r in self.model.values() if r.locked_until is not None})

    @precondition(lambda self: any(lease >= self._now() for lease in self._leases()))
    @rule(index=st.integers(0, MAX_ROWS), past=st.sampled_from([0, 1]))
    def expire_lease(self, index: int, past: int) -> None:
        """Move to the instant a current lease ends (it holds until then, exclusive) or past it."""
        current = [lease for lease in self._leases() if lease >= self._now()]
        self.clock.now = current[index % len(current)] + timedelta(seconds=past)

    def _pick(self, index: int, dead_only: bool) -> str:
        """A row by index: among the dead letters (if any) or among every row."""
        dead = [i for i in self.produced if self.model[i].status == DEAD_LETTER]
        pool = dead if dead_only and dead else self.produced
        return pool[index % len(pool)]

    @rule(index=st.integers(0, MAX_ROWS - 1), dead_only=st.booleans())
    def replay(self, index: int, dead_only: bool) -> None:
        event_id = self._pick(index, dead_only)
        row = self.model[event_id]
        now = self._now()
        result = self.run(
            replay_dead_letter(self.engine, [event_id], operator="sm", now=now, strict=False)
        )
        if row.status != DEAD_LETTER:
            assert result.replayed == [], f"replayed {row.status} row {event_id}"
            assert result.refused == {event_id: f"status is {row.status}, not dead_letter"}
            return
        assert result.replayed == [event_id], result.refused
        self.stats.replays += 1
        was_skipped = row.skipped_at is not None
        row.status = PENDING
        row.attempt_count = 0
        row.next_retry_at = None
        row.skipped_at = None
        row.replay_count += 1
        row.last_replayed_at = now
        if was_skipped:  # to the back of its key: a new seq after every other row
            seq = self.run(self._snapshot())[event_id]["seq"]
            assert all(seq > r.seq for r in self.model.values() if r.id != event_id)
            row.seq = seq

    @rule(index=st.integers(0, MAX_ROWS - 1), dead_only=st.booleans())
    def skip(self, index: int, dead_only: bool) -> None:
        event_id = self._pick(index, dead_only)
        row = self.model[event_id]
        now = self._now()
        result = self.run(
            skip_dead_letter(self.engine, [event_id], operator="sm", now=now, strict=False)
        )
        if row.status != DEAD_LETTER or row.ordering_key is None or row.skipped_at is not None:
            assert result.skipped == [], f"skipped {row.status} row {event_id}"
            assert event_id in result.refused
            return
        assert result.skipped == [event_id], result.refused
        self.stats.skips += 1
        row.skipped_at = now

    # -- invariants, after every step ---------------------------------------------------

    @invariant()
    def outbox_invariants(self) -> None:
        self.stats.steps += 1
        db = self.run(self._snapshot())
        assert sorted(db) == sorted(self.produced), "rows lost or appeared"
        in_flight: dict[str, str] = {}
        for event_id, stored in db.items():
            row = self.model[event_id]
            status = stored["status"]
            assert status in STATUSES
            leased = stored["locked_by"] is not None, stored["locked_until"] is not None
            assert leased == ((True, True) if status == PUBLISHING else (False, False)), stored
            assert (stored["published_at"] is not None) == (status == PUBLISHED), stored
            assert (stored["dead_letter_reason"] is not None) == (status == DEAD_LETTER), stored
            if stored["skipped_at"] is not None:
                assert status == DEAD_LETTER and stored["ordering_key"] is not None, stored
            version = stored["claim_version"]
            assert version >= self.seen_versions.get(event_id, 0), "claim_version went back"
            self.seen_versions[event_id] = version
            assert 0 <= stored["attempt_count"] <= version, stored
            budget = stored["max_attempts"]
            if status in (PENDING, FAILED):
                assert stored["attempt_count"] < budget, f"no attempt left but {status}: {stored}"
            if status == PUBLISHED:
                assert stored["attempt_count"] <= budget, stored
            if status == PUBLISHING and stored["ordering_key"] is not None:
                key = stored["ordering_key"]
                assert key not in in_flight, f"two events of {key} in flight"
                in_flight[key] = event_id
                self._check_order(row)
            assert stored["seq"] == row.seq
            actual = tuple(stored[name] for name in COLUMNS)
            assert actual == row.compared(), (
                f"row {event_id}: database {dict(zip(COLUMNS, actual, strict=True))} "
                f"!= model {dict(zip(COLUMNS, row.compared(), strict=True))}"
            )


def _settings(soak: bool) -> settings:
    return settings(
        max_examples=SOAK_EXAMPLES if soak else 25,
        stateful_step_count=60 if soak else 30,
        deadline=None,
        derandomize=not soak,  # CI: the same examples every run; soak: new ones each time
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def machine_url(request: pytest.FixtureRequest) -> tuple[str, str]:
    """A fresh database per test (rows are cleared between examples), and its name."""
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return request.param, request.getfixturevalue(fixture)


@pytest.mark.slow
async def test_outbox_state_machine(machine_url: tuple[str, str], soak: bool) -> None:
    database, url = machine_url
    await create_schema(url)
    if database == "postgresql":  # nor may a vacuum move rows mid-example (see _clear)
        engine = create_engine(url)
        try:
            async with engine.begin() as conn:
                for table in CLEAR:
                    await conn.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = off)"))
        finally:
            await engine.dispose()
    stats = Stats()
    started = time.monotonic()
    # Each example runs on its own event loop (hypothesis drives the rules synchronously),
    # so the whole run goes to a thread: this test's loop stays free.
    await asyncio.to_thread(
        run_state_machine_as_test, lambda: OutboxMachine(url, stats), settings=_settings(soak)
    )
    stats.seconds = time.monotonic() - started
    assert stats.examples >= (SOAK_EXAMPLES if soak else 25)
    assert stats.refused > 0, "no late completion was tried: the machine explores too little"
    assert stats.real_rounds > 0 and stats.replays > 0 and stats.skips > 0
    size = "--soak" if soak else ""
    record(
        ScenarioResult(
            scenario="state-machine",
            database=database,
            runs=stats.examples,
            events=stats.events,
            late_completions_refused=stats.refused,
            command=(
                f'make test PYTEST_ARGS="tests/reliability/test_state_machine.py -k {database}'
                f'{" " + size if size else ""}"'
            ),
            soak=soak,
            notes=[
                f"{stats.steps:,} steps checked ({stats.seconds:.1f} s); "
                f"{stats.completions:,} fenced completions, {stats.refused:,} refused: "
                f"{stats.refused_expired:,} after lease expiry, "
                f"{stats.refused_superseded:,} with a stale claim_version, "
                f"{stats.refused_finished:,} of rows already completed; "
                f"{stats.abandoned_reclaims:,} expired leases reclaimed, "
                f"{stats.real_rounds:,} real dispatcher rounds, {stats.replays:,} replays, "
                f"{stats.skips:,} skips, {stats.dead_letters:,} dead letters"
            ],
        )
    )
