"""Ordering keys: one event in flight per key, in write order; failures and dead letters hold
the key; skip and replay release it. Every body runs on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, select, text

from engine import (
    DispatchResult,
    EventHandlerPermanentError,
    EventValidationError,
    OutboxDispatcher,
    OutboxEventPublisher,
    unit_of_work,
)
from engine.dispatch import fenced_writes
from engine.dispatch.claimer import ClaimCursor, Claimer
from engine.errors import ReplayError
from engine.operating.insights import EventFilter, OutboxInsights
from engine.operating.replay import replay_dead_letter, skip_dead_letter
from engine.storage.schema import outbox_events, replay_log
from engine.writing.publisher import OutboxEvent

from .conftest import CTX, order_payload, row


@pytest.fixture
def ordered(registry):
    """orders.placed is ordered by aggregate (and blocks on a dead letter)."""
    registry.set_ordering("orders.placed")
    return registry


async def publish(db, registry, aggregates, event_type="orders.placed", **kw):
    """One event per entry of ``aggregates`` (an aggregate id each), in that order."""
    drafts = [
        OutboxEvent(event_type, order_payload(f"{agg}-{i}"), "order", agg, **kw)
        for i, agg in enumerate(aggregates)
    ]
    async with unit_of_work(db, registry=registry, context=CTX) as session:
        return await OutboxEventPublisher(session).publish_many(drafts)


def dispatcher(db, registry, clock, **kw):
    kw.setdefault("batch_size", 50)
    return OutboxDispatcher(db, registry, clock=clock, **kw)


async def test_events_of_one_key_go_one_at_a_time_in_write_order(db, ordered, clock):
    seen = []

    @ordered.handler("orders.placed", key="orders.audit")
    async def audit(envelope):
        seen.append(envelope.event_id)

    ids = await publish(db, ordered, ["a", "a", "a"])
    assert (await row(db, ids[0]))["ordering_key"] == "order:a"
    worker = dispatcher(db, ordered, clock)
    for _ in ids:  # only the head of the key is claimable, so each round takes one
        assert await worker.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert await worker.dispatch_once() == DispatchResult()
    assert seen == ids


async def test_unrelated_keys_run_concurrently_and_unordered_rows_are_unaffected(
    db, ordered, clock
):
    running = 0
    most = 0
    gate = asyncio.Event()

    @ordered.handler("orders.placed", key="orders.slow")
    async def slow(envelope):
        nonlocal running, most
        running += 1
        most = max(most, running)
        if most == 5:
            gate.set()
        await asyncio.wait_for(gate.wait(), 5)
        running -= 1

    @ordered.handler("orders.cancelled", key="orders.slow")
    async def also_slow(envelope):
        await slow(envelope)

    await publish(db, ordered, ["a", "b", "c", "a", "b"])
    await publish(db, ordered, ["x", "x"], event_type="orders.cancelled")  # unordered type
    result = await dispatcher(db, ordered, clock).dispatch_once()
    assert result == DispatchResult(claimed=5, published=5)  # heads a, b, c + both unordered
    assert most == 5


async def test_a_failed_head_holds_its_key_until_its_retry_succeeds(db, ordered, clock):
    seen = []

    @ordered.handler("orders.placed", key="orders.flaky")
    async def flaky(envelope):
        seen.append((envelope.event_id, envelope.attempt_count))
        if envelope.attempt_count == 1 and envelope.event_id == ids[0]:
            raise RuntimeError("vendor down")

    ids = await publish(db, ordered, ["a", "a", "b"])
    worker = dispatcher(db, ordered, clock)
    assert await worker.dispatch_once() == DispatchResult(claimed=2, published=1, failed=1)
    assert await worker.dispatch_once() == DispatchResult()  # a's second event waits
    clock.advance(3600)
    assert await worker.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert await worker.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert [s for s in seen if s[0] != ids[2]] == [(ids[0], 1), (ids[0], 2), (ids[1], 1)]


async def test_a_dead_letter_blocks_its_key_until_skipped(db, ordered, clock):
    seen = []

    @ordered.handler("orders.placed", key="orders.picky")
    async def picky(envelope):
        if envelope.event_id == ids[0]:
            raise EventHandlerPermanentError("bad address")
        seen.append(envelope.event_id)

    ids = await publish(db, ordered, ["a", "a", "a"])
    worker = dispatcher(db, ordered, clock)
    assert await worker.dispatch_once() == DispatchResult(claimed=1, dead_lettered=1)
    assert await worker.dispatch_once() == DispatchResult()
    insights = OutboxInsights(db, clock=clock)
    [blocked] = await insights.blocked_keys()
    assert (blocked.ordering_key, blocked.head_id, blocked.head_status, blocked.waiting) == (
        "order:a",
        ids[0],
        "dead_letter",
        2,
    )
    assert "bad address" in (blocked.head_error or "")
    overview = await insights.overview()
    assert overview.blocked_keys == 1
    assert overview.oldest_blocked_head_at == (await row(db, ids[0]))["created_at"]
    assert await insights.waiting_behind(ids[0]) == 2
    assert (await insights.event_detail(ids[2])).earlier_in_key == 2

    skipped = await skip_dead_letter(db, [ids[0]], operator="ops", reason="known bad", now=clock())
    assert skipped.skipped == [ids[0]]
    assert await worker.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert await worker.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert seen == ids[1:]
    assert (await row(db, ids[0]))["status"] == "dead_letter"
    assert await insights.blocked_keys() == []
    async with db.connect() as conn:
        audit = (await conn.execute(select(replay_log))).mappings().one()
    assert (audit["event_id"], audit["action"], audit["operator"], audit["reason"]) == (
        ids[0],
        "skip",
        "ops",
        "known bad",
    )


async def test_the_overview_counts_what_waits_behind_dead_letters_not_behind_retries(
    db, ordered, clock
):
    """Events behind a dead-lettered head wait for an operator; behind a failed head they
    drain once its retry succeeds. The trend leaves only the first kind out of its ETA."""

    @ordered.handler("orders.placed", key="orders.picky")
    async def picky(envelope):
        if envelope.event_id == ids[0]:
            raise EventHandlerPermanentError("bad address")
        if envelope.event_id == ids[3]:
            raise RuntimeError("vendor down")

    ids = await publish(db, ordered, ["a", "a", "a", "b", "b"])
    worker = dispatcher(db, ordered, clock)
    assert await worker.dispatch_once() == DispatchResult(claimed=2, failed=1, dead_lettered=1)
    insights = OutboxInsights(db, clock=clock)
    overview = await insights.overview()
    assert overview.blocked_keys == 2  # a behind its dead letter, b behind its retry
    assert overview.held_by_dead_letters == 2  # a's two; b's one drains after the retry

    await skip_dead_letter(db, [ids[0]], operator="ops", reason="known bad", now=clock())
    assert (await insights.overview()).held_by_dead_letters == 0


async def test_skip_refuses_what_it_cannot_release(db, ordered, clock):
    [pending] = await publish(db, ordered, ["a"])
    with pytest.raises(ReplayError, match="not dead_letter"):
        await skip_dead_letter(db, [pending])
    result = await skip_dead_letter(db, [pending, "nope"], strict=False)
    assert result.skipped == []
    assert set(result.refused) == {pending, "nope"}


async def test_the_skip_policy_releases_the_key_when_the_event_is_dead_lettered(
    db, registry, clock
):
    registry.set_ordering("orders.placed", on_dead_letter="skip")

    @registry.handler("orders.placed", key="orders.picky")
    async def picky(envelope):
        if envelope.event_id == ids[0]:
            raise EventHandlerPermanentError("bad")

    ids = await publish(db, registry, ["a", "a"])
    worker = dispatcher(db, registry, clock)
    assert await worker.dispatch_once() == DispatchResult(claimed=1, dead_lettered=1)
    assert await worker.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert (await row(db, ids[0]))["skipped_at"] == clock.now


async def test_replaying_the_blocked_head_delivers_it_first(db, ordered, clock):
    seen = []
    broken = {"on": True}

    @ordered.handler("orders.placed", key="orders.picky")
    async def picky(envelope):
        if broken["on"] and envelope.event_id == ids[0]:
            raise EventHandlerPermanentError("bad")
        seen.append(envelope.event_id)

    ids = await publish(db, ordered, ["a", "a"])
    worker = dispatcher(db, ordered, clock)
    await worker.dispatch_once()
    broken["on"] = False
    await replay_dead_letter(db, [ids[0]], now=clock())
    while (await worker.dispatch_once()).claimed:
        pass
    assert seen == ids


async def test_a_replayed_skipped_event_goes_to_the_back_of_its_key(db, ordered, clock):
    seen = []
    broken = {"on": True}

    @ordered.handler("orders.placed", key="orders.picky")
    async def picky(envelope):
        if broken["on"] and envelope.event_id == ids[0]:
            raise EventHandlerPermanentError("bad")
        seen.append(envelope.event_id)

    ids = await publish(db, ordered, ["a", "a"])
    worker = dispatcher(db, ordered, clock)
    await worker.dispatch_once()  # ids[0] dead
    await skip_dead_letter(db, [ids[0]])
    [later] = await publish(db, ordered, ["a"])  # written after the skip
    broken["on"] = False
    await replay_dead_letter(db, [ids[0]])
    first_seq = (await row(db, ids[0]))["seq"]
    assert first_seq > (await row(db, later))["seq"]
    while (await worker.dispatch_once()).claimed:
        pass
    assert seen == [ids[1], later, ids[0]]
    [new] = await publish(db, ordered, ["a"])  # the sequence carries on after the re-numbered row
    assert (await row(db, new))["seq"] > first_seq


async def test_no_event_of_a_key_starts_while_another_is_in_flight(db, ordered, clock):
    """Even a row that commits late with a lower seq (producers that do not serialise
    their writes per key) waits while a later event of its key is in flight."""
    [later] = await publish(db, ordered, ["a"])
    async with db.begin() as conn:  # a dispatcher holds it
        await conn.execute(
            outbox_events.update()
            .where(outbox_events.c.id == later)
            .values(
                status="publishing", locked_by="other", locked_until=clock.now.replace(year=2030)
            )
        )
        await conn.execute(
            text(
                "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, "
                "aggregate_type, aggregate_id, payload, ordering_key, seq) VALUES "
                "('late', 'acme', 'orders.placed', 1, 'order', 'a', :p, 'order:a', 0)"
            ),
            {
                "p": '{"order_id": "a", "amount": 1, "tenant_id": "acme", "actor_id": "u", '
                '"request_id": "r"}'
            },
        )
    assert await dispatcher(db, ordered, clock).dispatch_once() == DispatchResult()


async def test_a_plain_sql_row_with_a_key_is_ordered(db, registry, clock):
    seen = []

    @registry.handler("orders.cancelled", key="orders.audit")
    async def audit(envelope):
        seen.append(envelope.event_id)

    payload = '{"tenant_id": "acme", "actor_id": "u", "request_id": "r"}'
    async with db.begin() as conn:
        for event_id in ("z-first", "a-second"):  # ids that do not sort in write order
            await conn.execute(
                text(
                    "INSERT INTO outbox_events (id, tenant_id, event_type, event_version, "
                    "aggregate_type, aggregate_id, payload, ordering_key) VALUES "
                    "(:id, 'acme', 'orders.cancelled', 1, 'order', '7', :p, 'invoice:7')"
                ),
                {"id": event_id, "p": payload},
            )
    worker = dispatcher(db, registry, clock)
    assert await worker.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert await worker.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert seen == ["z-first", "a-second"]  # seq (write order), not id order


async def test_publish_can_override_or_add_a_key_and_refuses_an_empty_one(db, ordered, clock):
    [custom] = await publish(db, ordered, ["a"], ordering_key="customer:9")
    [added] = await publish(db, ordered, ["b"], event_type="orders.cancelled", ordering_key="c:1")
    [unordered] = await publish(db, ordered, ["c"], event_type="orders.cancelled")
    assert (await row(db, custom))["ordering_key"] == "customer:9"
    assert (await row(db, added))["ordering_key"] == "c:1"
    assert (await row(db, unordered))["ordering_key"] is None
    with pytest.raises(EventValidationError, match="ordering_key"):
        await publish(db, ordered, ["d"], ordering_key="")


async def test_the_key_can_come_from_the_payload(db, registry, clock):
    registry.set_ordering("orders.placed", key=lambda payload: f"customer:{payload['amount']}")
    [by_payload] = await publish(db, registry, ["a"])
    assert (await row(db, by_payload))["ordering_key"] == "customer:10"


async def test_filtering_by_key_lists_the_undelivered_events_of_the_key(db, ordered, clock):
    ids = await publish(db, ordered, ["a", "a", "b"])

    @ordered.handler("orders.placed", key="orders.noop")
    async def noop(envelope):
        return None

    await dispatcher(db, ordered, clock).dispatch_once()  # a's head and b go out
    page = await OutboxInsights(db, clock=clock).events_page(EventFilter(ordering_key="order:a"))
    assert [e.id for e in page.events] == [ids[1]]
    assert page.events[0].ordering_key == "order:a"


async def test_producers_that_lock_their_aggregate_write_a_key_in_commit_order(db, ordered):
    """The producer rule: take the aggregate's row lock before publishing its events.

    Producer A locks the account first and publishes late; producer B starts meanwhile.
    B's events may only be written once A committed, so write order (seq) is commit
    order. On SQLite every writer is serialised anyway (BEGIN IMMEDIATE).
    """
    business = MetaData()
    accounts = Table(
        "test_accounts", business, Column("id", String(20), primary_key=True), Column("n", Integer)
    )
    async with db.begin() as conn:
        await conn.run_sync(business.create_all)
        await conn.execute(accounts.insert().values(id="a", n=0))
    a_locked, a_may_publish = asyncio.Event(), asyncio.Event()

    async def produce(name: str) -> str:
        async with unit_of_work(db, registry=ordered, context=CTX) as session:
            await session.execute(select(accounts).where(accounts.c.id == "a").with_for_update())
            await session.execute(accounts.update().values(n=accounts.c.n + 1))
            if name == "A":
                a_locked.set()
                await a_may_publish.wait()
            return await OutboxEventPublisher(session).publish(
                "orders.placed",
                order_payload(name),
                aggregate_type="order",
                aggregate_id="a",
            )

    first = asyncio.create_task(produce("A"))
    await a_locked.wait()
    second = asyncio.create_task(produce("B"))
    await asyncio.sleep(0.3)  # B is waiting for A's lock
    assert not second.done()
    a_may_publish.set()
    id_a, id_b = await first, await second
    assert (await row(db, id_a))["seq"] < (await row(db, id_b))["seq"]


async def claim(db, clock, dispatcher_id="d", *, batch_size, **cursor):
    """One claim of ``dispatcher_id`` from ``ClaimCursor(**cursor)``, in its own transaction."""
    claimer = Claimer(
        dispatcher_id, batch_size, timedelta(seconds=30), cursor=ClaimCursor(**cursor)
    )
    async with db.begin() as conn:
        return await claimer.claim(conn, clock())


async def complete(db, clock, batch, dispatcher_id="d"):
    """Mark every row of ``batch`` published, as its dispatcher would."""

    claims = [(r.event_id, r.claim_version) for r in batch.rows]
    async with db.begin() as conn:
        done = await fenced_writes.mark_published(
            conn, claims, fenced_writes.Fence(dispatcher_id, clock())
        )
    assert len(done) == len(claims)


def keys_of(batch):
    return sorted(r.ordering_key for r in batch.rows)


async def test_after_going_round_past_keys_another_dispatcher_holds_the_next_walk_starts_at_its_own(
    db, ordered, clock
):
    """Two dispatchers split four keys. When x comes back for more, the keys after its
    cursor are y's, in flight: it goes round to its own. Its next walk starts at its own
    keys again instead of walking y's once more first; the one after goes on as usual."""
    await publish(db, ordered, ["a", "b", "c", "d"] * 3)
    x = await claim(db, clock, "x", batch_size=2)
    assert keys_of(x) == ["order:a", "order:b"]
    y = await claim(db, clock, "y", batch_size=2)
    assert keys_of(y) == ["order:c", "order:d"]
    await complete(db, clock, x, "x")
    x = await claim(db, clock, "x", batch_size=2, key=x.cursor.key)
    assert keys_of(x) == ["order:a", "order:b"]  # went round past y's keys
    assert (x.cursor.key, x.cursor.include_key) == ("order:a", True)
    await complete(db, clock, x, "x")
    x = await claim(db, clock, "x", batch_size=2, key=x.cursor.key, include_key=True)
    assert keys_of(x) == ["order:a", "order:b"]
    assert (x.cursor.key, x.cursor.include_key) == ("order:b", False)  # a lap as usual next


async def test_one_dispatcher_at_the_end_of_its_lap_goes_on_round_robin(db, ordered, clock):
    """Nothing after the cursor because the walk reached the last key is not another
    dispatcher's keys: the next claim goes on after the batch, every key in turn."""
    await publish(db, ordered, ["a", "b", "c", "d"] * 3)
    taken, cursor, include = [], "", False
    for _ in range(4):
        batch = await claim(db, clock, batch_size=2, key=cursor, include_key=include)
        taken.append(keys_of(batch))
        cursor, include = batch.cursor.key, batch.cursor.include_key
        await complete(db, clock, batch)
    ab, cd = ["order:a", "order:b"], ["order:c", "order:d"]
    assert taken == [ab, cd, ab, cd]


async def test_a_claim_past_the_last_due_key_goes_round_instead_of_coming_up_empty(
    db, ordered, clock
):
    ids = await publish(db, ordered, ["a", "b"])
    # the cursor is past both keys ("order:a", "order:b")
    batch = await claim(db, clock, batch_size=10, key="order:z")
    assert sorted(r.event_id for r in batch.rows) == sorted(ids)
    assert batch.cursor.key == ""


async def test_a_batch_filled_by_unordered_rows_first_keeps_the_key_cursor(db, registry, clock):
    """The walk over keys never ran (no room was left for heads), so the next one starts
    where this one would have, not over from the first key."""
    unordered = await publish(db, registry, ["u1", "u2", "u3"])
    await publish(db, registry, ["a"], ordering_key="k:a")
    await publish(db, registry, ["b"], ordering_key="k:b")
    batch = await claim(db, clock, batch_size=3, key="k:a", ordered_first=False)
    assert sorted(r.event_id for r in batch.rows) == sorted(unordered)
    assert batch.cursor.key == "k:a"
