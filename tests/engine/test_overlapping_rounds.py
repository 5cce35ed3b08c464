"""A slow handler does not hold the next rounds (``overlap_rounds``, the run loop's).

Once every event of a round has started and its next batch is claimed ahead, the round
returns and the next one starts beside the calls still in flight; those finish behind,
their outcomes written as they end. ``max_concurrency`` bounds both rounds together, keys
stay one event in flight and in order, a stop waits for the round behind, and a write
that fails behind is raised by the next round. PostgreSQL only: SQLite never claims ahead.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from engine import DispatchResult, OutboxDispatcher
from engine.dispatch import fenced_writes

from .conftest import rows
from .test_delivery_prefetch import fresh, key_for
from .test_relay_prefetch import (
    assert_each_key_in_order,
    assert_handed_back_unattempted,
    drain_all,
    publish,
)

pytestmark = pytest.mark.postgresql


@pytest.fixture
async def db(pg_url):
    engine = await fresh(pg_url)
    yield engine
    await engine.dispose()


class SlowFirst:
    """The first event's call (or the calls of ``slow_ids``) waits for ``release``; every
    other call awaits a little I/O. Records starts and ends, and the most calls in flight."""

    def __init__(self, pause: float = 0.02, slow_ids: frozenset[str] = frozenset()) -> None:
        self.release = asyncio.Event()
        self.pause = pause
        self.slow_ids = slow_ids
        self.slow: str | None = None
        self.started: list[str] = []
        self.ended: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, envelope) -> None:
        self.started.append(envelope.event_id)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if envelope.event_id in self.slow_ids or (not self.slow_ids and self.slow is None):
                self.slow = self.slow or envelope.event_id
                await asyncio.wait_for(self.release.wait(), timeout=8)
            else:
                await asyncio.sleep(self.pause)
        finally:
            self.in_flight -= 1
            self.ended.append(envelope.event_id)


def overlapping(db, registry, clock, handler, *, batch_size=3, max_concurrency=3):
    registry.register_handler("orders.placed", handler, key="overlap-test")
    return OutboxDispatcher(
        db,
        registry,
        clock=clock,
        batch_size=batch_size,
        max_concurrency=max_concurrency,
        prefetch=True,
        overlap_rounds=True,
    )


async def test_the_next_round_runs_beside_a_slow_call_within_max_concurrency(db, registry, clock):
    ids = await publish(db, registry, 6)
    handler = SlowFirst()
    dispatcher = overlapping(db, registry, clock, handler)

    first = await dispatcher.dispatch_once()  # returns with the slow call still in flight
    assert first.claimed == 3
    assert handler.slow == ids[0] and ids[0] not in handler.ended
    second = await dispatcher.dispatch_once()  # the batch claimed ahead, beside it
    assert second.claimed == 3
    assert set(ids[3:]) <= set(handler.ended)  # all delivered while the first call waited
    assert ids[0] not in handler.ended
    assert handler.most_in_flight == 3  # the round behind counted: never four at once

    handler.release.set()
    await dispatcher.release_prefetched()
    later = await dispatcher.report_unreported()
    assert (first + second + later).published == 6
    stored = await rows(db)
    assert {r["status"] for r in stored} == {"published"}
    assert {r["attempt_count"] for r in stored} == {1}  # each claimed once, none handed back
    assert Counter(handler.started) == Counter(ids)


async def test_a_round_that_cannot_hand_off_waits_as_before(db, registry, clock):
    ids = await publish(db, registry, 3)  # one batch: nothing to claim ahead
    handler = SlowFirst()
    dispatcher = overlapping(db, registry, clock, handler)
    asyncio.get_running_loop().call_later(0.2, handler.release.set)
    assert await dispatcher.dispatch_once() == DispatchResult(claimed=3, published=3)
    assert handler.ended[-1] == ids[0]


async def test_a_stop_waits_for_the_round_behind_and_hands_back_the_batch_ahead(
    db, registry, clock
):
    ids = await publish(db, registry, 9)
    handler = SlowFirst()
    dispatcher = overlapping(db, registry, clock, handler)
    first = await dispatcher.dispatch_once()
    assert first.claimed == 3  # handed off: ids[3:6] held
    by_id = {r["id"]: r for r in await rows(db)}
    assert [by_id[i]["status"] for i in ids[3:6]] == ["publishing"] * 3

    asyncio.get_running_loop().call_later(0.2, handler.release.set)
    await dispatcher.release_prefetched()
    by_id = {r["id"]: r for r in await rows(db)}
    assert by_id[ids[0]]["status"] == "published"  # finished and recorded before the return
    assert all(by_id[i]["status"] == "published" for i in ids[:3])
    await assert_handed_back_unattempted(db, ids[3:])
    # the round's three, written before it returned or reported since
    assert (first.published + (await dispatcher.report_unreported()).published) == 3


async def test_a_write_that_fails_behind_is_raised_by_the_next_round(db, registry, clock):
    ids = await publish(db, registry, 9)
    handler = SlowFirst()
    dispatcher = overlapping(db, registry, clock, handler)
    assert (await dispatcher.dispatch_once()).claimed == 3
    complete = dispatcher.writer.write

    failed = asyncio.Event()

    async def refused(outcomes):
        if any(o.row.event_id == ids[0] for o in outcomes):
            failed.set()
            raise ConnectionResetError("the database went away")
        return await complete(outcomes)

    dispatcher.writer.write = refused  # type: ignore[method-assign]
    handler.release.set()
    await asyncio.wait_for(failed.wait(), timeout=8)  # the slow call ended; its write failed
    deadline = asyncio.get_running_loop().time() + 5
    while not dispatcher.rounds.behind.all_done():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    with pytest.raises(ConnectionResetError):
        await dispatcher.dispatch_once()
    # the batch claimed ahead went back rather than wait out the run loop's back-off
    await assert_handed_back_unattempted(db, ids[3:6])
    assert (await dispatcher.dispatch_once()).claimed == 3  # then rounds go on
    await dispatcher.release_prefetched()
    by_id = {r["id"]: r for r in await rows(db)}
    assert by_id[ids[0]]["status"] == "publishing"  # left to its lease, never lost


async def test_keys_stay_one_in_flight_and_in_order_with_rounds_overlapping(db, registry, clock):
    ids = await publish(db, registry, 24, key=key_for)
    key_of = {event_id: key_for(i) for i, event_id in enumerate(ids)}
    in_flight: list[str] = []
    overlaps = 0
    calls: list[str] = []

    async def handler(envelope):
        nonlocal overlaps
        calls.append(envelope.event_id)
        key = key_of[envelope.event_id]
        if key is not None:
            overlaps += key in in_flight
            in_flight.append(key)
        try:
            # every third call is slow: rounds hand off beside it
            await asyncio.sleep(0.15 if len(calls) % 3 == 1 else 0.01)
        finally:
            if key is not None:
                in_flight.remove(key)

    dispatcher = overlapping(db, registry, clock, handler, batch_size=4, max_concurrency=4)
    await drain_all(db, dispatcher)
    assert Counter(calls) == Counter(ids)
    assert overlaps == 0
    assert_each_key_in_order(calls, ids, key_of)


async def test_a_round_whose_write_failed_does_not_hand_off(db, registry, clock):
    ids = await publish(db, registry, 6)
    handler = SlowFirst()
    # two at once: ids[1]'s outcome is written (and refused) while ids[2] still runs
    dispatcher = overlapping(db, registry, clock, handler, max_concurrency=2)
    complete = dispatcher.writer.write

    async def refused(outcomes):
        if any(o.row.event_id in ids[1:3] for o in outcomes):
            raise ConnectionResetError("the database went away")
        return await complete(outcomes)

    dispatcher.writer.write = refused  # type: ignore[method-assign]
    asyncio.get_running_loop().call_later(0.3, handler.release.set)
    with pytest.raises(ConnectionResetError):  # it waited for its slow call, then raised
        await dispatcher.dispatch_once()
    assert ids[0] in handler.ended
    assert not set(ids[3:]) & set(handler.started)  # the batch ahead was never started
    await assert_handed_back_unattempted(db, ids[3:])


async def test_a_cancelled_stop_leaves_no_round_running_behind(db, registry, clock):
    ids = await publish(db, registry, 12)
    handler = SlowFirst(slow_ids=frozenset({ids[0], ids[3]}))
    dispatcher = overlapping(db, registry, clock, handler)
    assert (await dispatcher.dispatch_once()).claimed == 3  # handed off, ids[0] behind
    assert (await dispatcher.dispatch_once()).claimed == 3  # and ids[3]: two rounds behind
    assert {ids[0], ids[3]} <= set(handler.started) - set(handler.ended)
    stopping = asyncio.create_task(dispatcher.release_prefetched())
    await asyncio.sleep(0.2)  # waiting for the slow call
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    # both calls were cancelled with the stop, not left running
    assert {ids[0], ids[3]} <= set(handler.ended)
    assert not [t for t in asyncio.all_tasks() if "_finish_behind" in repr(t.get_coro())]


async def test_completions_in_doubt_added_while_others_are_settled_are_kept(db, registry, clock):
    """A round finishing behind may fail a write while the next round asks which earlier
    writes landed: its rows are asked about next time, not forgotten."""
    dispatcher = overlapping(db, registry, clock, SlowFirst())
    dispatcher._in_doubt.claims["asked"] = 1
    landed = fenced_writes.completions_landed

    async def meanwhile(conn, claims):
        dispatcher._in_doubt.claims["added meanwhile"] = 2  # a write behind failed just now
        return await landed(conn, claims)

    fenced_writes.completions_landed = meanwhile  # type: ignore[assignment]
    try:
        await dispatcher._in_doubt.settle()
    finally:
        fenced_writes.completions_landed = landed  # type: ignore[assignment]
    assert dispatcher._in_doubt.claims == {"added meanwhile": 2}


async def test_a_stop_whose_hand_back_fails_still_reports_the_round_behind(
    db, registry, clock, caplog
):
    """The hand-back's error is raised; the write error behind it is logged, not dropped,
    and a completion in doubt that did land is still counted."""
    ids = await publish(db, registry, 9)
    handler = SlowFirst()
    dispatcher = overlapping(db, registry, clock, handler)
    first = await dispatcher.dispatch_once()  # handed off: ids[0] behind, ids[3:6] ahead
    complete = dispatcher.writer.write

    async def landed_then_cut_off(outcomes):
        written = await complete(outcomes)
        if any(o.row.event_id == ids[0] for o in outcomes):
            raise ConnectionResetError("cut off after COMMIT")  # committed all the same
        return written

    async def hand_back_refused(batch):
        raise ConnectionRefusedError("hand-back refused")

    dispatcher.writer.write = landed_then_cut_off  # type: ignore[method-assign]
    dispatcher.batches.release = hand_back_refused  # type: ignore[method-assign]
    asyncio.get_running_loop().call_later(0.2, handler.release.set)
    with (
        caplog.at_level("WARNING", logger="engine.dispatcher"),
        pytest.raises(ConnectionRefusedError),
    ):
        await dispatcher.release_prefetched()
    assert "cut off after COMMIT" in caplog.text  # the round behind's error, logged
    by_id = {r["id"]: r for r in await rows(db)}
    assert all(by_id[i]["status"] == "published" for i in ids[:3])
    # ids[0]'s write was in doubt; the stop asked, and counted it as published
    assert (first + await dispatcher.report_unreported()).published == 3
