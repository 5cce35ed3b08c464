"""Dispatching: claims, fencing, retries with backoff, dead letters, idempotent handlers."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from datetime import timedelta

import aiosqlite
import pytest
from sqlalchemy import select

from engine import (
    BackoffPolicy,
    DispatchResult,
    EventHandlerPermanentError,
    OutboxDispatcher,
    OutboxEventPublisher,
    create_engine,
    unit_of_work,
)
from engine.context import current_task_context
from engine.dispatch import ExternalPublishResult
from engine.dispatch.claimer import Claimer
from engine.storage.database import read_only_engine
from engine.storage.schema import handler_runs
from engine.writing.publisher import OutboxEvent

from .conftest import CTX, order_payload, row, rows

# On SQLite, and on PostgreSQL through asyncpg and through psycopg 3.
pytestmark = pytest.mark.all_drivers


async def publish(db, registry, count=1, max_attempts=None, prefix="o"):
    drafts = [
        OutboxEvent(
            "orders.placed",
            order_payload(f"{prefix}-{i}"),
            "order",
            f"{prefix}-{i}",
            max_attempts=max_attempts,
        )
        for i in range(count)
    ]
    async with unit_of_work(db, registry=registry, context=CTX) as session:
        return await OutboxEventPublisher(session).publish_many(drafts)


async def test_dispatch_once_publishes_a_batch_through_the_handler(db, registry, clock):
    seen = []

    @registry.handler("orders.placed", key="orders.audit")
    async def audit(envelope):
        seen.append((envelope.event_id, envelope.payload["order_id"], envelope.attempt_count))

    ids = await publish(db, registry, count=5)
    dispatcher = OutboxDispatcher(db, registry, batch_size=3, clock=clock, dispatcher_id="d1")
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=3, published=3)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=2, published=2)
    assert await dispatcher.dispatch_once() == DispatchResult()
    assert [s[0] for s in seen] == ids  # oldest first
    assert all(s[2] == 1 for s in seen)
    for stored in await rows(db):
        assert stored["status"] == "published"
        assert stored["published_at"] == clock.now
        assert stored["locked_by"] is None and stored["locked_until"] is None
        assert stored["claim_version"] == 1 and stored["attempt_count"] == 1


async def test_a_handler_starts_only_once_its_claim_is_committed(db, registry, clock, monkeypatch):
    """The claimed rows are decoded while the claim commits; until that commit is done
    another dispatcher could still take the events, so no handler may start before."""
    committed_reader = read_only_engine(db)  # SQLite: a deferred read, no wait for writers
    seen = []
    real_commit = aiosqlite.Connection.commit

    async def slow_commit(connection):  # SQLite's commits take 50 ms longer
        await asyncio.sleep(0.05)
        await real_commit(connection)

    monkeypatch.setattr(aiosqlite.Connection, "commit", slow_commit)

    @registry.handler("orders.placed", key="orders.audit")
    async def audit(envelope):
        found = await row(committed_reader, envelope.event_id)
        seen.append((found["status"], found["locked_by"], found["claim_version"]))

    await publish(db, registry, count=3)
    dispatcher = OutboxDispatcher(db, registry, batch_size=3, clock=clock, dispatcher_id="d1")
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=3, published=3)
    assert seen == [("publishing", "d1", 1)] * 3


async def test_task_context_and_trace_id_reach_the_handler(db, registry, clock):
    seen = []

    @registry.handler("orders.placed", key="orders.trace")
    async def trace(envelope):
        seen.append((envelope.trace_id, current_task_context()))

    await publish(db, registry)
    await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
    assert seen == [("trace-abc", CTX)]
    assert current_task_context() is None  # not leaked out of the handler


async def test_inside_a_handler_a_unit_of_work_context_wins_and_the_handler_is_known(
    db, registry, clock
):
    """The dispatcher's context and handler are built on demand; a unit of work the
    handler opens with a context of its own still overrides it while it is open."""
    from engine import TaskContext
    from engine.context import current_handler

    other = TaskContext("acme", "job-runner", "req-9")
    seen = []

    @registry.handler("orders.placed", key="orders.nested")
    async def nested(envelope):
        invocation = current_handler()
        seen.append((invocation.envelope, invocation.handler_key, current_task_context()))
        async with unit_of_work(db, registry=registry, context=other):
            seen.append(current_task_context())
        seen.append(current_task_context())

    [event_id] = await publish(db, registry)
    await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
    (envelope, key, inside), in_unit, after = seen
    assert (envelope.event_id, key, inside) == (event_id, "orders.nested", CTX)
    assert (in_unit, after) == (other, CTX)
    assert current_handler() is None and current_task_context() is None


async def test_transient_failures_follow_backoff_then_dead_letter(db, registry, clock):
    calls = []

    @registry.handler("orders.placed", key="orders.flaky")
    async def flaky(envelope):
        calls.append(clock.now)
        raise ConnectionError("smtp down")

    [event_id] = await publish(db, registry, max_attempts=4)
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, backoff=BackoffPolicy(base_seconds=10, max_seconds=25, jitter=0)
    )
    start = clock.now
    expected_delays = [10, 20, 25]  # doubling, capped
    for attempt, delay in enumerate(expected_delays, start=1):
        assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, failed=1)
        stored = await row(db, event_id)
        assert stored["status"] == "failed"
        assert stored["attempt_count"] == attempt
        assert stored["next_retry_at"] == clock.now + timedelta(seconds=delay)
        assert "ConnectionError: smtp down" in stored["last_error"]
        clock.advance(delay - 1)
        assert await dispatcher.dispatch_once() == DispatchResult()  # not due yet
        clock.advance(1)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, dead_lettered=1)
    stored = await row(db, event_id)
    assert stored["status"] == "dead_letter"
    assert stored["attempt_count"] == 4
    assert "max attempts reached (4/4)" in stored["dead_letter_reason"]
    assert stored["next_retry_at"] is None and stored["locked_by"] is None
    assert [(c - start).total_seconds() for c in calls] == [0, 10, 30, 55]
    assert await dispatcher.dispatch_once() == DispatchResult()


async def test_permanent_error_dead_letters_at_once(db, registry, clock):
    @registry.handler("orders.placed", key="orders.reject")
    async def reject(envelope):
        raise EventHandlerPermanentError("customer account closed")

    [event_id] = await publish(db, registry)
    result = await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
    assert result == DispatchResult(claimed=1, dead_lettered=1)
    stored = await row(db, event_id)
    assert stored["status"] == "dead_letter"
    assert stored["attempt_count"] == 1
    assert stored["dead_letter_reason"].startswith("permanent:")
    assert "customer account closed" in stored["last_error"]


async def test_schema_error_found_at_dispatch_dead_letters_without_calling_handlers(
    db, registry, clock
):
    called = []

    @registry.handler("orders.placed", key="orders.never")
    async def never(envelope):
        called.append(envelope)

    async with db.begin() as conn:  # written by another service, bypassing validation
        await conn.exec_driver_sql(
            "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, aggregate_type,"
            " aggregate_id, payload) VALUES ('0190a8e0-0000-7000-8000-000000000001', 'acme',"
            " 'orders.placed', 1, 'order', 'o-9', '{\"order_id\": 9}')"
        )
        await conn.exec_driver_sql(
            "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, aggregate_type,"
            " aggregate_id, payload) VALUES ('0190a8e0-0000-7000-8000-000000000002', 'acme',"
            " 'orders.placed', 7, 'order', 'o-9', '{}')"
        )
    result = await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
    assert result == DispatchResult(claimed=2, dead_lettered=2)
    first, second = await rows(db)
    assert first["dead_letter_reason"].startswith("permanent: schema:")
    assert "'order_id' must be str" in first["dead_letter_reason"]
    assert "version 7 is not registered" in second["dead_letter_reason"]
    assert called == []


async def test_corrupt_payload_row_is_dead_lettered_and_the_batch_goes_on(
    sqlite_url, registry, clock
):
    from engine import create_schema

    db = create_engine(sqlite_url)
    await create_schema(db)
    try:
        handled = []

        @registry.handler("orders.placed", key="orders.ok")
        async def ok(envelope):
            handled.append(envelope.event_id)

        async with db.begin() as conn:  # a table made before the JSON check refused this
            await conn.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
            await conn.exec_driver_sql(
                "INSERT INTO outbox_events (id, tenant_id, event_type, event_version,"
                " aggregate_type, aggregate_id, payload) VALUES"
                " ('0190a8e0-0000-7000-8000-000000000001', 'acme', 'orders.placed', 1,"
                " 'order', 'o-1', '{not json')"
            )
            await conn.exec_driver_sql("PRAGMA ignore_check_constraints = OFF")
        [good] = await publish(db, registry)
        result = await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
        assert result == DispatchResult(claimed=2, published=1, dead_lettered=1)
        assert handled == [good]
        async with db.connect() as conn:
            status, reason = (
                await conn.exec_driver_sql(
                    "SELECT status, dead_letter_reason FROM outbox_events"
                    " WHERE id = '0190a8e0-0000-7000-8000-000000000001'"
                )
            ).one()
        assert status == "dead_letter"
        assert "corrupt payload" in reason
    finally:
        await db.dispose()


async def test_expired_lease_cannot_complete_and_another_dispatcher_reclaims(db, registry, clock):
    calls = Counter()
    second = OutboxDispatcher(db, registry, clock=clock, dispatcher_id="d2", lease_seconds=30)
    inner_results = []

    @registry.handler("orders.placed", key="orders.slow")
    async def slow(envelope):
        calls[envelope.event_id] += 1
        if calls[envelope.event_id] == 1:
            # The first dispatcher stalls past its lease; the second reclaims meanwhile.
            clock.advance(31)
            inner_results.append(await second.dispatch_once())

    [event_id] = await publish(db, registry)
    first = OutboxDispatcher(db, registry, clock=clock, dispatcher_id="d1", lease_seconds=30)
    result = await first.dispatch_once()
    assert inner_results == [DispatchResult(claimed=1, published=1)]
    assert result == DispatchResult(claimed=1, lost_leases=1)
    stored = await row(db, event_id)
    assert stored["status"] == "published"
    assert stored["claim_version"] == 2
    assert calls[event_id] == 2


async def test_a_stalled_dispatcher_does_not_complete_even_without_a_rival(db, registry, clock):
    @registry.handler("orders.placed", key="orders.fail_late")
    async def fail_late(envelope):
        clock.advance(31)
        raise RuntimeError("too late anyway")

    [event_id] = await publish(db, registry)
    dispatcher = OutboxDispatcher(db, registry, clock=clock, dispatcher_id="d1", lease_seconds=30)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, lost_leases=1)
    stored = await row(db, event_id)
    assert stored["status"] == "publishing"  # untouched: the lease had expired
    assert stored["last_error"] is None
    # crash recovery: the expired lease is reclaimable
    recovered = []

    registry._handlers.clear()

    @registry.handler("orders.placed", key="orders.recover")
    async def recover(envelope):
        recovered.append(envelope.attempt_count)

    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert recovered == [2]


class FlakyWrites(OutboxDispatcher):
    """A dispatcher whose completion writes numbered in ``fail_on`` (1-based) raise, as when
    a restart cuts the connection mid-COMMIT: with ``lands`` the write commits first (only
    its acknowledgement is lost)."""

    def __init__(self, *args, fail_on=(), lands=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.writes = 0
        self.fail_on = set(fail_on)
        self.lands = lands
        self._write = self.writer.write
        self.writer.write = self._flaky_write  # type: ignore[method-assign]

    async def _flaky_write(self, outcomes):
        self.writes += 1
        if self.writes not in self.fail_on:
            return await self._write(outcomes)
        if self.lands:
            await self._write(outcomes)
        raise ConnectionResetError("connection was closed in the middle of operation")


async def rounds_as_the_run_loop_counts(dispatcher, clock, rounds=8):
    """The sum of what the rounds that returned reported, and of the report on stop (a
    round that raises is a storage error to the run loop); leases expire between rounds."""
    total = DispatchResult()
    for _ in range(rounds):
        with contextlib.suppress(ConnectionResetError):  # a storage error to the run loop
            total = total + await dispatcher.dispatch_once()
        clock.advance(31)
    await dispatcher.release_prefetched()
    return total + await dispatcher.report_unreported()


async def test_completions_whose_commit_landed_unacknowledged_are_counted_once(db, registry, clock):
    """Totals (and so metrics) stay exact across a cut-off commit: the writes that landed
    are read back and counted on the next round; the ones that did not are redelivered
    once their lease expires and counted then. Nothing is counted twice."""
    calls = Counter()

    @registry.handler("orders.placed", key="orders.cut")
    async def handler(envelope):
        calls[envelope.event_id] += 1
        if envelope.payload["order_id"] == "o-0":
            raise RuntimeError("flaky")

    await publish(db, registry, count=3)
    dispatcher = FlakyWrites(db, registry, clock=clock, dispatcher_id="d1", fail_on={1})
    with pytest.raises(ConnectionResetError):
        await dispatcher.dispatch_once()
    assert Counter(r["status"] for r in await rows(db)) == {"published": 2, "failed": 1}
    # The next round reads the landed outcomes back (the failed row waits for its backoff)
    # and reports them with the claim of the round that raised.
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=3, published=2, failed=1)
    assert await dispatcher.dispatch_once() == DispatchResult()  # counted once only

    # A write that did not land: the rows stay claimed until their lease expires.
    more = await publish(db, registry, count=2, prefix="m")
    dispatcher.fail_on, dispatcher.lands = {dispatcher.writes + 1}, False
    with pytest.raises(ConnectionResetError):
        await dispatcher.dispatch_once()
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=2)  # nothing landed
    clock.advance(31)
    total = DispatchResult()
    for _ in range(4):  # expired leases come back one per claim
        total = total + await dispatcher.dispatch_once()
    assert (total.published, total.lost_leases) == (2, 0)
    assert [calls[i] for i in more] == [2, 2]  # at-least-once: run again, counted once
    statuses = Counter(r["status"] for r in await rows(db))
    assert statuses["published"] == 4


async def test_a_round_that_raises_loses_no_count(db, registry, clock):
    """Counts settled or written in a round that then raised reach the next report: the
    in-doubt completions it read back, and its own writes before the one that failed."""

    @registry.handler("orders.placed", key="orders.counted")
    async def handler(envelope):
        if envelope.payload["order_id"] == "o-1":
            await asyncio.sleep(0.05)  # its outcome goes in a second write

    await publish(db, registry, count=1, prefix="a")
    # Write 1 lands unacknowledged; the next round settles it, then its own write 2 raises.
    d = FlakyWrites(db, registry, clock=clock, dispatcher_id="d1", fail_on={1, 2})
    with pytest.raises(ConnectionResetError):
        await d.dispatch_once()
    await publish(db, registry, count=1, prefix="b")
    with pytest.raises(ConnectionResetError):
        await d.dispatch_once()
    total = await rounds_as_the_run_loop_counts(d, clock)
    assert Counter(r["status"] for r in await rows(db)) == {"published": 2}
    assert total.published == 2

    # Two writes in one round, the second lost: the first one's count survives the raise.
    await publish(db, registry, count=2)
    d = FlakyWrites(db, registry, clock=clock, dispatcher_id="d2", fail_on={2}, lands=False)
    with pytest.raises(ConnectionResetError):
        await d.dispatch_once()
    assert d.writes == 2
    total = await rounds_as_the_run_loop_counts(d, clock)
    assert Counter(r["status"] for r in await rows(db)) == {"published": 4}
    assert (total.published, total.lost_leases) == (2, 0)


async def test_a_row_whose_leases_keep_expiring_is_dead_lettered_not_looped(db, registry, clock):
    [event_id] = await publish(db, registry, max_attempts=2)

    for _ in range(2):  # two dispatchers crash while holding it
        async with db.begin() as conn:
            claimed = await Claimer("crash", 10, timedelta(seconds=5)).claim(conn, clock())
        assert [c.event_id for c in claimed.rows] == [event_id]
        clock.advance(6)
    called = []

    @registry.handler("orders.placed", key="orders.x")
    async def handler(envelope):
        called.append(envelope)

    result = await OutboxDispatcher(db, registry, clock=clock).dispatch_once()
    assert result == DispatchResult(claimed=1, dead_lettered=1)
    assert called == []
    assert "lease expired" in (await row(db, event_id))["dead_letter_reason"]


async def test_racing_dispatchers_never_handle_one_event_twice(database_url, registry):
    from engine import create_schema

    engines = [create_engine(database_url) for _ in range(3)]
    await create_schema(engines[0])
    try:
        handled = Counter()

        @registry.handler("orders.placed", key="orders.count")
        async def count(envelope):
            handled[envelope.event_id] += 1
            await asyncio.sleep(0)

        ids = set(await publish(engines[0], registry, count=300))
        dispatchers = [
            OutboxDispatcher(e, registry, batch_size=7, dispatcher_id=f"d{i}")
            for i, e in enumerate(engines)
        ]

        async def drain(dispatcher):
            totals = DispatchResult()
            idle = 0
            while idle < 3:
                result = await dispatcher.dispatch_once()
                totals += result
                idle = idle + 1 if result.claimed == 0 else 0
                await asyncio.sleep(0)
            return totals

        totals = await asyncio.gather(*(drain(d) for d in dispatchers))
        assert sum(t.published for t in totals) == 300
        assert sum(t.lost_leases for t in totals) == 0
        assert set(handled) == ids
        assert set(handled.values()) == {1}
        assert {r["status"] for r in await rows(engines[0])} == {"published"}
        assert {r["claim_version"] for r in await rows(engines[0])} == {1}
    finally:
        for e in engines:
            await e.dispose()


async def test_handler_that_succeeded_is_skipped_when_the_event_is_retried(db, registry, clock):
    calls = Counter()

    @registry.handler("orders.placed", key="orders.first")
    async def first(envelope):
        calls["first"] += 1

    @registry.handler("orders.placed", key="orders.second")
    async def second(envelope):
        calls["second"] += 1
        if calls["second"] == 1:
            raise TimeoutError("crm slow")

    await publish(db, registry)
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, backoff=BackoffPolicy(base_seconds=1, jitter=0)
    )
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, failed=1)
    clock.advance(1)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert calls == {"first": 1, "second": 2}


async def test_a_handler_that_succeeded_under_a_lost_lease_is_skipped_on_redelivery(
    db, registry, clock
):
    """Its completion is refused (the lease ran out mid-handler, nobody took the row over),
    yet the handler's success is recorded: the next delivery skips it."""
    calls = Counter()

    @registry.handler("orders.placed", key="orders.slow_success")
    async def slow_success(envelope):
        calls[envelope.attempt_count] += 1
        if envelope.attempt_count == 1:
            clock.advance(31)  # past the 30 s lease

    [event_id] = await publish(db, registry)
    dispatcher = OutboxDispatcher(db, registry, clock=clock, lease_seconds=30)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, lost_leases=1)
    assert (await row(db, event_id))["status"] == "publishing"
    clock.advance(1)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert calls == {1: 1}  # the second delivery skipped the handler that had succeeded


async def test_a_lost_completion_records_only_the_handlers_that_ran_in_that_delivery(
    db, registry, clock
):
    """First delivery: one handler succeeds, the other fails. Second: the first is skipped,
    the second succeeds but its lease runs out. Third: neither runs again, and the skipped
    handler's record is not counted as a second run."""
    calls = Counter()

    @registry.handler("orders.placed", key="orders.first")
    async def first(envelope):
        calls["first"] += 1

    @registry.handler("orders.placed", key="orders.second")
    async def second(envelope):
        calls["second"] += 1
        if envelope.attempt_count == 1:
            raise TimeoutError("crm slow")
        clock.advance(31)  # past the 30 s lease

    [event_id] = await publish(db, registry)
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, lease_seconds=30, backoff=BackoffPolicy(base_seconds=1, jitter=0)
    )
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, failed=1)
    clock.advance(1)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, lost_leases=1)
    clock.advance(1)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert calls == {"first": 1, "second": 2}
    async with db.connect() as conn:
        runs = dict(
            (
                await conn.execute(
                    select(handler_runs.c.handler_key, handler_runs.c.attempt_count).where(
                        handler_runs.c.event_id == event_id
                    )
                )
            ).all()
        )
    assert runs == {"orders.first": 1, "orders.second": 2}


async def test_external_publisher_outcomes_and_unattempted_rows_keep_their_budget(
    db, registry, clock
):
    ids = await publish(db, registry, count=3)

    class Relay:
        def __init__(self):
            self.batches = []

        async def publish(self, envelopes):
            self.batches.append([e.event_id for e in envelopes])
            return ExternalPublishResult(
                published={ids[0]}, failed={ids[1]: "NO_ROUTE"}, unattempted={ids[2]}
            )

    relay = Relay()
    dispatcher = OutboxDispatcher(db, registry, clock=clock, external_publisher=relay)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=3, published=1, failed=1)
    assert relay.batches == [ids]
    published, failed, released = [await row(db, i) for i in ids]
    assert published["status"] == "published"
    assert failed["status"] == "failed" and failed["last_error"] == "NO_ROUTE"
    assert released["status"] == "pending" and released["attempt_count"] == 0
    assert released["locked_by"] is None


async def test_a_broker_away_never_takes_an_events_last_attempt(db, registry, clock):
    """A failure the relay blames on the broker (unavailable) is retried with backoff; on
    the last attempt the attempt is given back, so a long outage dead-letters nothing. The
    same failure blamed on the event dead-letters it."""
    away, poison = await publish(db, registry, count=2, max_attempts=1)
    broker_back = False

    class Relay:
        async def publish(self, envelopes):
            if broker_back:
                return ExternalPublishResult(published={e.event_id for e in envelopes})
            error = "broker unavailable: no publisher confirm within 10 s"
            return ExternalPublishResult(
                failed={away: error, poison: "refused"}, unavailable={away}
            )

    dispatcher = OutboxDispatcher(
        db,
        registry,
        clock=clock,
        external_publisher=Relay(),
        backoff=BackoffPolicy(base_seconds=5, jitter=0),
    )
    for _ in range(3):  # the outage goes on: three rounds, each a last attempt
        await dispatcher.dispatch_once()
        stored = await row(db, away)
        assert stored["status"] == "failed" and stored["attempt_count"] == 0
        assert stored["last_error"].startswith("broker unavailable")
        assert (await dispatcher.dispatch_once()).claimed == 0  # it waits out its backoff
        clock.advance(5)
    assert (await row(db, poison))["status"] == "dead_letter"
    broker_back = True
    assert (await dispatcher.dispatch_once()).published == 1
    assert (await row(db, away))["status"] == "published"


async def test_external_publisher_crash_fails_the_call_without_losing_rows(db, registry, clock):
    ids = await publish(db, registry, count=2)

    class Broken:
        async def publish(self, envelopes):
            raise RuntimeError("channel closed")

    dispatcher = OutboxDispatcher(db, registry, clock=clock, external_publisher=Broken())
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=2, failed=2)
    assert {(await row(db, i))["status"] for i in ids} == {"failed"}


async def test_handlers_are_not_started_once_most_of_the_lease_is_spent(db, registry, clock):
    handled = []

    @registry.handler("orders.placed", key="orders.slowish")
    async def slowish(envelope):
        handled.append(envelope.event_id)
        clock.advance(9)  # each event takes 9 s of a 30 s lease

    ids = await publish(db, registry, count=5)
    dispatcher = OutboxDispatcher(db, registry, clock=clock, lease_seconds=30)
    result = await dispatcher.dispatch_once()
    # 0 s, 9 s, 18 s start inside 80 % of the lease (24 s); the 4th would start at 27 s.
    assert result == DispatchResult(claimed=5, published=3)
    assert handled == ids[:3]
    for event_id in ids[3:]:
        stored = await row(db, event_id)
        assert stored["status"] == "pending" and stored["attempt_count"] == 0
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=2, published=2)


async def test_a_dispatcher_budget_overrides_every_rows_max_attempts(db, registry, clock):
    seen = []

    @registry.handler("orders.placed", key="orders.down")
    async def down(envelope):
        seen.append((envelope.attempt_count, envelope.max_attempts))
        raise ConnectionError("still down")

    [event_id] = await publish(db, registry)  # the row's own budget: 10
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, max_attempts=2, backoff=BackoffPolicy(base_seconds=1, jitter=0)
    )
    assert (await dispatcher.dispatch_once()).failed == 1
    clock.advance(1)
    assert (await dispatcher.dispatch_once()).dead_lettered == 1
    stored = await row(db, event_id)
    assert stored["status"] == "dead_letter" and stored["max_attempts"] == 10
    assert "max attempts reached (2/2)" in stored["dead_letter_reason"]
    # Handlers (and the relay, which picks its probe by attempts left) see that budget.
    assert seen == [(1, 2), (2, 2)]


async def test_expired_leases_are_reclaimed_one_at_a_time_so_a_poison_row_cannot_sink_a_batch(
    db, registry, clock
):
    """A row that kills its dispatcher spends only its own attempts."""

    ids = await publish(db, registry, count=5, max_attempts=3)
    lease = timedelta(seconds=5)

    async def claim() -> list[str]:
        async with db.begin() as conn:
            rows = await Claimer("crashy", 10, lease).claim(conn, clock())
        return [r.event_id for r in rows.rows]

    assert await claim() == ids  # the dispatcher takes all five, then dies
    clock.advance(6)
    seen = []
    for _ in range(5):  # each abandoned row comes back alone, never with the others
        reclaimed = await claim()
        assert len(reclaimed) == 1
        seen += reclaimed
        clock.advance(6)  # ... and that dispatcher dies too
    assert sorted(seen) == ids
    handled = []

    @registry.handler("orders.placed", key="orders.ok")
    async def ok(envelope):
        handled.append(envelope.event_id)

    dispatcher = OutboxDispatcher(db, registry, clock=clock, batch_size=10)
    total = DispatchResult()
    while (result := await dispatcher.dispatch_once()).claimed:
        total += result
    # two claims each (attempt 3 of 3 is the one that runs): nothing dead-lettered
    assert total == DispatchResult(claimed=5, published=5)
    assert sorted(handled) == ids
