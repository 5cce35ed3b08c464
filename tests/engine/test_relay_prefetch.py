"""A relay's next batch claimed ahead (``prefetch``): while the confirms of one batch are
outstanding, the next is claimed, so the broker's pipeline does not drain between rounds.

The guarantees stay those of a round: rows held ahead are fenced like any claim, go back
unattempted (no attempt spent) unless the round they wait behind published everything,
and the in-flight guard keeps one event per ordering key on the way.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from engine import DispatchResult, OutboxDispatcher, OutboxEventPublisher, unit_of_work
from engine.dispatch import ExternalPublishResult
from engine.running.run_loop import run_dispatcher
from engine.writing.publisher import OutboxEvent

from .conftest import CTX, order_payload, rows


async def publish(db, registry, count, *, key=None):
    drafts = [
        OutboxEvent(
            "orders.placed",
            order_payload(f"o-{i}"),
            "order",
            f"o-{i}",
            ordering_key=key(i) if key else None,
        )
        for i in range(count)
    ]
    async with unit_of_work(db, registry=registry, context=CTX) as session:
        return await OutboxEventPublisher(session).publish_many(drafts)


async def drain_all(db, dispatcher):
    """Rounds until every row is published (40 at most), then hand back what is held ahead."""
    for _ in range(40):
        if {r["status"] for r in await rows(db)} == {"published"}:
            break
        await dispatcher.dispatch_once()
    await dispatcher.release_prefetched()
    assert {r["status"] for r in await rows(db)} == {"published"}


def assert_each_key_in_order(delivered, ids, key_of):
    """Within each key, ``delivered`` follows the publish order ``ids``."""
    for key in set(key_of.values()):
        assert [i for i in delivered if key_of[i] == key] == [i for i in ids if key_of[i] == key]


def held(stored):
    return [r["id"] for r in stored if r["status"] == "publishing"]


class Relay:
    """Publishes everything; while a batch is out, waits until the next one is claimed."""

    def __init__(self, db, fail=frozenset(), wait_for_next=True):
        self.db = db
        self.fail = set(fail)
        self.wait_for_next = wait_for_next
        self.batches: list[list[str]] = []
        self.claimed_while_out: list[list[str]] = []

    async def publish(self, envelopes):
        ids = [e.event_id for e in envelopes]
        self.batches.append(ids)
        give_up = asyncio.get_running_loop().time() + 8  # the claim ahead runs beside this call
        while True:
            stored = await rows(self.db)
            others = [i for i in held(stored) if i not in ids]
            nothing_to_claim = all(r["status"] != "pending" for r in stored)
            if others or nothing_to_claim or not self.wait_for_next:
                break
            if asyncio.get_running_loop().time() > give_up:
                break
            await asyncio.sleep(0.01)
        self.claimed_while_out.append(others)
        failed = {i: "NO_ROUTE" for i in ids if i in self.fail}
        return ExternalPublishResult(published=set(ids) - set(failed), failed=failed)


async def test_the_next_batch_is_claimed_while_the_last_is_out_and_used_by_the_next_round(
    db, registry, clock
):
    ids = await publish(db, registry, 5)
    relay = Relay(db)
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, batch_size=2, external_publisher=relay, prefetch=True
    )
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=2, published=2)
    assert relay.claimed_while_out == [ids[2:4]]  # claimed beside the first call
    assert held(await rows(db)) == ids[2:4]  # and held for the next round

    assert await dispatcher.dispatch_once() == DispatchResult(claimed=2, published=2)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=1, published=1)
    assert relay.batches == [ids[0:2], ids[2:4], ids[4:5]]
    stored = await rows(db)
    assert {r["status"] for r in stored} == {"published"}
    assert {r["attempt_count"] for r in stored} == {1}  # one claim each, none wasted


async def test_after_a_failure_the_batch_claimed_ahead_goes_back_without_spending_an_attempt(
    db, registry, clock
):
    ids = await publish(db, registry, 4)
    relay = Relay(db, fail={ids[0]})
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, batch_size=2, external_publisher=relay, prefetch=True
    )
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=2, published=1, failed=1)
    assert relay.claimed_while_out == [ids[2:4]]
    await assert_handed_back_unattempted(db, ids[2:4])  # a wait may follow: none stays held


async def assert_handed_back_unattempted(db, ids) -> None:
    """``ids`` are pending again, unleased, with no attempt spent on them."""
    by_id = {r["id"]: r for r in await rows(db)}
    for event_id in ids:
        assert by_id[event_id]["status"] == "pending"
        assert by_id[event_id]["attempt_count"] == 0
        assert by_id[event_id]["locked_by"] is None


async def assert_a_stop_hands_back_what_was_claimed_ahead(db, dispatcher, ids) -> None:
    """Batch size 2, ``ids`` four events: the second pair, claimed ahead, goes back as new."""
    assert (await dispatcher.dispatch_once()).published == 2
    stop = asyncio.Event()
    stop.set()
    assert (await dispatcher.dispatch_once(stop)).published == 0
    await assert_handed_back_unattempted(db, ids[2:])


async def assert_the_run_loop_hands_back_what_it_claimed_ahead(db, dispatcher, ids) -> None:
    """Batch size 2, ``ids`` four events: one iteration, then nothing is left held."""
    summary = await run_dispatcher(dispatcher, max_iterations=1)
    assert summary.published == 2
    by_id = {r["id"]: r for r in await rows(db)}
    assert [by_id[i]["status"] for i in ids[2:]] == ["pending", "pending"]
    assert held(await rows(db)) == []


def relay_dispatcher(db, registry, clock):
    return OutboxDispatcher(
        db, registry, clock=clock, batch_size=2, external_publisher=Relay(db), prefetch=True
    )


async def test_a_stop_hands_the_batch_claimed_ahead_back(db, registry, clock):
    ids = await publish(db, registry, 4)
    dispatcher = relay_dispatcher(db, registry, clock)
    await assert_a_stop_hands_back_what_was_claimed_ahead(db, dispatcher, ids)


async def test_the_run_loop_hands_back_what_it_claimed_ahead_when_it_ends(db, registry, clock):
    ids = await publish(db, registry, 4)
    dispatcher = relay_dispatcher(db, registry, clock)
    await assert_the_run_loop_hands_back_what_it_claimed_ahead(db, dispatcher, ids)


async def test_lost_leases_at_hand_back_are_reported_even_after_a_round_that_raised(
    db, registry, clock
):
    """Rows claimed ahead and taken over before the hand-back are lost leases; a round that
    raises right after the hand-back does not lose them, nor does the report on stop."""
    await publish(db, registry, 4)
    d1 = relay_dispatcher(db, registry, clock)
    assert (await d1.dispatch_once()).published == 2  # and 2 held ahead
    clock.advance(d1.lease.total_seconds() + 1)
    other = OutboxDispatcher(
        db,
        registry,
        clock=clock,
        batch_size=2,
        dispatcher_id="other",
        external_publisher=Relay(db, wait_for_next=False),
    )
    assert (await other.dispatch_once()).published == 1  # one abandoned row taken over

    async def claim_fails():
        raise ConnectionResetError("connection was closed in the middle of operation")

    d1.batches.claim = claim_fails  # the storage error comes right after the stale hand-back
    with pytest.raises(ConnectionResetError):
        await d1.dispatch_once()
    await d1.release_prefetched()  # the run loop's stop
    assert (await d1.report_unreported()).lost_leases == 2  # both refused at hand-back


async def test_without_prefetch_nothing_is_claimed_ahead(db, registry, clock):
    ids = await publish(db, registry, 4)
    relay = Relay(db, wait_for_next=False)
    dispatcher = OutboxDispatcher(db, registry, clock=clock, batch_size=2, external_publisher=relay)
    assert (await dispatcher.dispatch_once()).published == 2
    assert relay.claimed_while_out == [[]]
    assert held(await rows(db)) == []
    assert len(ids) == 4


async def test_one_event_per_key_on_the_way_and_each_key_in_order(db, registry, clock):
    ids = await publish(db, registry, 12, key=lambda i: f"k{i % 3}")
    key_of = {event_id: f"k{i % 3}" for i, event_id in enumerate(ids)}
    relay = Relay(db, wait_for_next=False)
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, batch_size=3, external_publisher=relay, prefetch=True
    )
    await drain_all(db, dispatcher)
    published = [event_id for batch in relay.batches for event_id in batch]
    assert Counter(published) == Counter(ids)  # each once
    assert_each_key_in_order(published, ids, key_of)
    for batch in relay.batches:
        assert len({key_of[i] for i in batch}) == len(batch)  # never two of a key at once


async def test_the_publisher_may_prepare_the_batch_claimed_ahead(db, registry, clock):
    ids = await publish(db, registry, 4)

    class Preparing(Relay):
        def __init__(self, db):
            super().__init__(db)
            self.prepared: list[list[str]] = []

        async def prepare(self, envelopes):
            self.prepared.append([e.event_id for e in envelopes])

    relay = Preparing(db)
    dispatcher = OutboxDispatcher(
        db, registry, clock=clock, batch_size=2, external_publisher=relay, prefetch=True
    )
    assert (await dispatcher.dispatch_once()).published == 2
    assert relay.prepared == [ids[2:4]]  # built while the first batch's completion commits
    assert (await dispatcher.dispatch_once()).published == 2
    assert relay.batches == [ids[0:2], ids[2:4]]
